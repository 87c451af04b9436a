//! memshim as users install and run it: `make install`, the wheels (x86_64,
//! and aarch64 under qemu-user), `memshim-ctl run`, `doctor`, `metrics` and
//! `serve`. One test binary; the modules were separate binaries before
//! (`deploy_<module>`). `make test-aarch64` runs `aarch64::` alone.

mod aarch64;
mod install;
mod linker;
mod metrics;
mod run_doctor;
mod wheel;
