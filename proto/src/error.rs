//! Error responses and their stable codes.

use crate::python::PythonUnavailable;
use serde::{Deserialize, Serialize};

/// Stable error codes (`"code"` of an error response). Clients branch on
/// these, never on the message text.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The line is not JSON, not an object, or not a valid request.
    BadRequest,
    /// The line exceeds `MAX_REQUEST_BYTES`; the server closes the connection.
    TooLarge,
    /// No complete request within `IDLE_TIMEOUT_MS`; the server closes.
    Timeout,
    /// A request other than `hello` came first.
    HelloRequired,
    /// The client's version is older than the server's oldest.
    VersionMismatch,
    /// The `op` is not known to this server (newer client).
    UnknownOp,
    /// The peer's uid is neither the process's effective uid nor root;
    /// the server closes the connection.
    PermissionDenied,
    /// Too many connections; this one was dropped to make room.
    Busy,
    /// An argument is out of range (for example a decay below -1).
    InvalidArgument,
    /// The action needs CPython and it cannot be used now (see `python`).
    PythonUnavailable,
    /// The allocator or the OS refused (message says which call).
    Internal,
    /// `profile`: the process started without `MEMSHIM_PROFILE=on`, so
    /// jemalloc's profiler cannot be switched on in it.
    ProfilingOff,
    /// A code this build does not know (sent by a newer server).
    #[serde(other)]
    Unknown,
}

impl ErrorCode {
    /// The wire name of the code.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::Timeout => "timeout",
            ErrorCode::HelloRequired => "hello_required",
            ErrorCode::VersionMismatch => "version_mismatch",
            ErrorCode::UnknownOp => "unknown_op",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::Busy => "busy",
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::PythonUnavailable => "python_unavailable",
            ErrorCode::Internal => "internal",
            ErrorCode::ProfilingOff => "profiling_off",
            ErrorCode::Unknown => "unknown",
        }
    }
}

/// The body of an error response.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ErrorReply {
    /// Stable code.
    pub code: ErrorCode,
    /// One sentence for a person: what is wrong and what to do.
    pub message: String,
    /// Why CPython could not be used (code `python_unavailable` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<PythonUnavailable>,
}

impl ErrorReply {
    /// An error with a code and a message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ErrorReply {
        ErrorReply {
            code,
            message: message.into(),
            python: None,
        }
    }

    /// The `python_unavailable` error for `why`.
    pub fn python(why: PythonUnavailable) -> ErrorReply {
        ErrorReply {
            code: ErrorCode::PythonUnavailable,
            message: why.to_string(),
            python: Some(why),
        }
    }
}

impl std::fmt::Display for ErrorReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.code.as_str())
    }
}
