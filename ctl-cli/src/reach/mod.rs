//! Reaching a process: finding its control socket, checking that the answer
//! comes from that process, talking to it, reading what `/proc` says about
//! it, and saying in words why a process has no endpoint; and reaching a
//! CPython started without the preload by ptrace (`ptrace/`); and reading
//! the files its user controls (`untrusted`).

pub mod client;
pub mod no_endpoint;
pub mod procfs;
pub mod ptrace;
pub mod socket;
pub mod untrusted;
