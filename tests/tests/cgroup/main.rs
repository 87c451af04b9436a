//! Real memory cgroups: `memshim-ctl cgroup` and `reclaim` (and `reclaim
//! --to`), their errors, and the return of memory under pressure. One test binary; the modules
//! were separate binaries before (`cgroup_<module>`).

mod charge;
mod errors;
mod pressure;
mod resize;
