//! The per-process control endpoint (issue "Control plane").
//!
//! Interface used by `supervisor.rs`; everything here runs on the shim's
//! own thread except `after_fork_child` (fork child handler: async-signal-safe
//! work only) and `at_exit` (library destructor).
//!
//! This is the placeholder the shim core ships with: no endpoint.

/// A listening endpoint owned by the shim's thread.
pub struct Endpoint {
    _private: (),
}

impl Endpoint {
    /// Opens the endpoint, or `None` if it cannot or must not exist.
    pub fn open() -> Option<Endpoint> {
        None
    }

    /// The descriptor to poll for readability, if it is still ours.
    pub fn poll_fd(&self) -> Option<i32> {
        None
    }

    /// Called when `poll_fd` is readable: accept and serve, bounded.
    pub fn on_ready(&mut self) {}

    /// Called on every tick: housekeeping.
    pub fn on_tick(&mut self) {}

    /// Closes the endpoint and removes its socket file.
    pub fn close(self) {}
}

/// Fork child: close inherited descriptors without touching the parent's
/// socket file. Async-signal-safe work only.
pub fn after_fork_child() {}

/// Library destructor: remove this process's socket file.
pub fn at_exit() {}
