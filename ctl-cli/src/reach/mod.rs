//! Reaching a process: finding its control socket, checking that the answer
//! comes from that process, talking to it, reading what `/proc` says about
//! it, and saying in words why a process has no endpoint.

pub mod client;
pub mod no_endpoint;
pub mod procfs;
pub mod socket;
