//! The shim in ordinary processes: what it interposes, how it is
//! configured, the programs and odd hosts it must leave unchanged, its
//! thread, and the idle return of freed memory. One test binary; the
//! modules were separate binaries before (`core_<module>`).

mod compat;
mod config;
mod forks;
mod glibc_api;
mod idle_return;
mod interpose;
mod odd_hosts;
mod programs;
mod threads;
