//! The control protocol shared by libmemshim.so and memshim-ctl
//! (specified in docs/protocol.md).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

/// Protocol version spoken by this build.
pub const PROTOCOL_VERSION: u32 = 1;
