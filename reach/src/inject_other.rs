//! The injector where it is not built: every architecture but x86_64.
//! The same interface as inject.rs; holding a thread fails before anything
//! of the process is touched, so every verb says so and changes nothing.

pub use crate::failure::Failure;
use std::io;
use std::time::Duration;

/// Never made here: [`hold`] fails.
pub struct Held {
    /// The thread's id.
    pub tid: i32,
    /// The system call it was interrupted in.
    pub syscall: &'static str,
}

/// Fails: this build has no injector.
pub fn hold(_pid: i32, _limit: Duration, _prefer: impl Fn(i32) -> bool) -> Result<Held, Failure> {
    Err(Failure::Io(format!(
        "reaching a process without the preload is built for x86_64 only (this is {})",
        std::env::consts::ARCH
    )))
}

impl Held {
    /// Unreachable: no `Held` is made here.
    pub fn put(&mut self, _offset: u64, _bytes: &[u8]) -> io::Result<u64> {
        Err(io::ErrorKind::Unsupported.into())
    }

    /// Unreachable: no `Held` is made here.
    pub fn read_u64(&self, _addr: u64) -> io::Result<u64> {
        Err(io::ErrorKind::Unsupported.into())
    }

    /// Unreachable: no `Held` is made here.
    pub fn read_cstr(&self, _addr: u64, _max: usize) -> io::Result<String> {
        Err(io::ErrorKind::Unsupported.into())
    }

    /// Unreachable: no `Held` is made here.
    pub fn call(&mut self, _func: u64, _args: &[u64]) -> Result<u64, Failure> {
        Err(Failure::Io("no injector in this build".into()))
    }

    /// Unreachable: no `Held` is made here.
    pub fn finish(self) -> Result<(), Failure> {
        Ok(())
    }
}
