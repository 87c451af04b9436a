//! The control protocol shared by libmemshim.so and memshim-ctl
//! (specified in docs/protocol.md).
//!
//! * Transport: a Unix stream socket, one per process
//!   (`<dir>/<pid>-<starttime>-<pidns>.sock`, see [`endpoint`]).
//! * Framing: newline-delimited JSON. The client writes one request line,
//!   the server answers with one response line, and so on. A request line is
//!   at most [`MAX_REQUEST_BYTES`] bytes including its `\n`.
//! * The first request on a connection must be [`Request::Hello`].
//! * A response is `{"ok":{"kind":...,...}}` or `{"error":{"code":...,...}}`.
//!
//! Compatibility: fields may be added to replies and optional fields to
//! requests without a version bump (both sides ignore unknown fields and
//! treat missing optional fields as absent). Removing or changing the
//! meaning of a field, or a new required request field, bumps
//! [`PROTOCOL_VERSION`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod actions;
pub mod cgroup;
#[cfg(feature = "client")]
pub mod client;
#[cfg(test)]
mod doc_examples;
pub mod endpoint;
mod error;
pub mod exit;
#[cfg(test)]
mod golden;
pub mod procfs;
mod profile;
mod python;
mod requests;
pub mod settings;
mod stats;

pub use actions::*;
pub use endpoint::*;
pub use error::*;
pub use profile::*;
pub use python::*;
pub use requests::*;
pub use stats::*;

use serde::{Deserialize, Serialize};

/// Protocol version spoken by this build.
pub const PROTOCOL_VERSION: u32 = 1;
/// Oldest protocol version this build still speaks.
pub const MIN_PROTOCOL_VERSION: u32 = 1;
/// Longest request line the server accepts, `\n` included.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// Longest response line a client should accept, `\n` included (a heap
/// profile sent inline by a shim of an earlier release is the longest).
pub const MAX_RESPONSE_BYTES: usize = 32 * 1024 * 1024;
/// Milliseconds a connection may stay without sending a complete request before
/// the server closes it (counted from the accept or from the end of the last
/// answer; what arrived while the server was busy elsewhere is read first).
pub const IDLE_TIMEOUT_MS: u64 = 5000;

/// One response line: `{"ok":{...}}` or `{"error":{...}}`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    /// The request succeeded.
    Ok(Reply),
    /// The request failed; see [`ErrorCode`].
    Error(ErrorReply),
}

impl Response {
    /// One line of JSON, `\n` included.
    pub fn to_line(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).unwrap_or_else(|_| {
            br#"{"error":{"code":"internal","message":"response could not be encoded"}}"#.to_vec()
        });
        v.push(b'\n');
        v
    }

    /// Decodes one response line (trailing `\n` optional).
    pub fn from_line(line: &[u8]) -> Result<Response, serde_json::Error> {
        serde_json::from_slice(trim_newline(line))
    }
}

impl Request {
    /// One line of JSON, `\n` included.
    pub fn to_line(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).expect("requests always encode");
        v.push(b'\n');
        v
    }
}

fn trim_newline(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Decodes one request line, telling an unknown `op` (a newer client) from
/// a malformed line.
pub fn parse_request(line: &[u8]) -> Result<Request, ErrorReply> {
    let line = trim_newline(line);
    let value: serde_json::Value = serde_json::from_slice(line).map_err(|e| {
        ErrorReply::new(
            ErrorCode::BadRequest,
            format!("request is not valid JSON: {e}"),
        )
    })?;
    let Some(obj) = value.as_object() else {
        return Err(ErrorReply::new(
            ErrorCode::BadRequest,
            "request must be a JSON object",
        ));
    };
    let op = match obj.get("op") {
        Some(serde_json::Value::String(s)) => s.clone(),
        _ => {
            return Err(ErrorReply::new(
                ErrorCode::BadRequest,
                "request has no \"op\" string",
            ));
        }
    };
    if !OPS.contains(&op.as_str()) {
        let shown: String = op.chars().take(64).collect();
        return Err(ErrorReply::new(
            ErrorCode::UnknownOp,
            format!("unknown op {shown:?}; this server knows {}", OPS.join(", ")),
        ));
    }
    serde_json::from_value(value)
        .map_err(|e| ErrorReply::new(ErrorCode::BadRequest, format!("bad {op} request: {e}")))
}

/// The version a server speaking `[min, max]` answers to a client that
/// speaks up to `client`, or `None` if they have none in common.
pub fn negotiate(client: u32, min: u32, max: u32) -> Option<u32> {
    (client >= min).then(|| client.min(max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_op_is_told_apart_from_garbage() {
        assert_eq!(
            parse_request(b"{\"op\":\"frobnicate\"}\n")
                .unwrap_err()
                .code,
            ErrorCode::UnknownOp
        );
        assert_eq!(
            parse_request(b"\x00\xff").unwrap_err().code,
            ErrorCode::BadRequest
        );
        assert_eq!(
            parse_request(b"[1,2]").unwrap_err().code,
            ErrorCode::BadRequest
        );
        assert_eq!(
            parse_request(b"{\"op\":7}").unwrap_err().code,
            ErrorCode::BadRequest
        );
        assert_eq!(
            parse_request(b"{\"op\":\"decay\",\"dirty_ms\":\"x\"}")
                .unwrap_err()
                .code,
            ErrorCode::BadRequest
        );
    }

    #[test]
    fn requests_round_trip() {
        for r in [
            Request::Hello {
                version: 1,
                client: Some("t".into()),
            },
            Request::Stats {
                arenas: true,
                pss: false,
            },
            Request::Purge,
            Request::Decay {
                dirty_ms: Some(-1),
                muzzy_ms: None,
            },
            Request::Gc,
            Request::EmptyCache,
            Request::Release,
        ] {
            let line = r.to_line();
            assert_eq!(parse_request(&line).unwrap(), r);
            assert!(OPS.contains(&r.op()));
        }
    }

    #[test]
    fn negotiation() {
        assert_eq!(negotiate(1, 1, 1), Some(1));
        assert_eq!(negotiate(7, 1, 2), Some(2));
        assert_eq!(negotiate(0, 1, 2), None);
    }
}
