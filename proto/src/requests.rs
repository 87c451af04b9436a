//! Every control request, declared once (see "Adding a request" in
//! docs/design.md). From one entry of [`requests!`] come the variant of
//! [`Request`] and its `op` name, the variant of [`Reply`] and its payload
//! type ([`Answer`]), the time class a client waits for ([`Wait`]) and the
//! example line the golden test round-trips.

use crate::actions::{
    DecayResult, DetachResult, EmptyCacheResult, GcResult, PurgeResult, ReleaseResult,
};
use crate::endpoint::HelloReply;
use crate::profile::{ProfileAction, ProfileReply, PyTraceAction, PyTraceReply};
use crate::stats::StatsReport;
use serde::{Deserialize, Serialize};

/// How long a client should wait for an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Answered from the shim's own state in milliseconds.
    Short,
    /// May wait for Python (the bridge waits up to 5 s for the GIL, then
    /// works) or for jemalloc's profiler writing a dump.
    Long,
}

/// A reply payload that belongs to exactly one request: what a client
/// expects back from that request.
pub trait Answer: Sized {
    /// The `kind` of the reply (the request's `op`).
    const KIND: &'static str;
    /// The payload, or the reply itself when it is of another kind.
    fn from_reply(r: Reply) -> Result<Self, Reply>;
}

/// One entry per request:
/// `doc; "op" => Variant { fields } -> ReplyPayload, Wait, "example line";`
macro_rules! requests {
    ($(
        $(#[$doc:meta])*
        $op:literal => $V:ident $({ $( $(#[$fm:meta])* $f:ident : $t:ty ),* $(,)? })?
            -> $R:ty, $wait:ident, $example:literal;
    )*) => {
        /// A request: one JSON object on one line, discriminated by `"op"`.
        #[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
        #[serde(tag = "op")]
        pub enum Request {
            $(
                $(#[$doc])*
                #[serde(rename = $op)]
                $V $({ $( $(#[$fm])* $f : $t ),* })?,
            )*
        }

        /// A successful reply, discriminated by `"kind"` (the request's `op`).
        #[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
        #[serde(tag = "kind")]
        pub enum Reply {
            $(
                #[doc = concat!("Answer to `", $op, "`.")]
                #[serde(rename = $op)]
                $V($R),
            )*
        }

        /// Every `op` this build knows, in documentation order.
        pub const OPS: &[&str] = &[$($op),*];

        impl Request {
            /// The `op` string of this request.
            pub fn op(&self) -> &'static str {
                match self {
                    $(Request::$V { .. } => $op,)*
                }
            }

            /// How long a client waits for the answer.
            pub fn wait(&self) -> Wait {
                match self {
                    $(Request::$V { .. } => Wait::$wait,)*
                }
            }
        }

        impl Reply {
            /// The `kind` string of this reply.
            pub fn kind(&self) -> &'static str {
                match self {
                    $(Reply::$V(_) => $op,)*
                }
            }
        }

        $(
            impl Answer for $R {
                const KIND: &'static str = $op;
                fn from_reply(r: Reply) -> Result<Self, Reply> {
                    match r {
                        Reply::$V(x) => Ok(x),
                        other => Err(other),
                    }
                }
            }
        )*

        /// One example line per request, in declaration order.
        #[cfg(test)]
        pub(crate) const EXAMPLES: &[(&str, &str)] = &[$(($op, $example)),*];
    };
}

requests! {
    /// First request of every connection: the client's protocol version.
    "hello" => Hello {
        /// Highest protocol version the client speaks.
        version: u32,
        /// Free-form client name, for logs (`"memshim-ctl 0.1.0"`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        client: Option<String>,
    } -> HelloReply, Short, r#"{"op":"hello","version":1,"client":"memshim-ctl 0.1.0"}"#;

    /// The memory report ([`StatsReport`]).
    "stats" => Stats {
        /// Include the per-arena list.
        #[serde(default)]
        arenas: bool,
        /// Read PSS from `/proc/self/smaps_rollup` (costs about 16 ms per
        /// GiB resident, so it is opt-in).
        #[serde(default)]
        pss: bool,
    } -> Box<StatsReport>, Short, r#"{"op":"stats","arenas":false,"pss":false}"#;

    /// Flush the shim thread's cache and purge every arena ([`PurgeResult`]).
    "purge" => Purge -> PurgeResult, Short, r#"{"op":"purge"}"#;

    /// Change decay at runtime ([`DecayResult`]). Absent fields are unchanged.
    "decay" => Decay {
        /// New dirty decay in ms, -1 = never.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dirty_ms: Option<i64>,
        /// New muzzy decay in ms, -1 = never.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        muzzy_ms: Option<i64>,
    } -> DecayResult, Short, r#"{"op":"decay","dirty_ms":-1}"#;

    /// A full `gc.collect()` in the hosted CPython ([`GcResult`]).
    "gc" => Gc -> GcResult, Long, r#"{"op":"gc"}"#;

    /// `torch.cuda.empty_cache()` on devices that already have a context
    /// ([`EmptyCacheResult`]).
    "empty_cache" => EmptyCache -> EmptyCacheResult, Long, r#"{"op":"empty_cache"}"#;

    /// gc, then empty_cache, then purge ([`ReleaseResult`]).
    "release" => Release -> ReleaseResult, Long, r#"{"op":"release"}"#;

    /// jemalloc's heap profiler: start, stop, reset, or dump
    /// ([`ProfileReply`]); needs `MEMSHIM_PROFILE=on` in the process.
    "profile" => Profile {
        /// What to do (default: report the state).
        #[serde(default)]
        action: ProfileAction,
        /// `start`: the shim switches sampling off again after this many
        /// seconds (1 to 86400; default 3600) if no `stop` came first.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seconds: Option<u64>,
    } -> Box<ProfileReply>, Long, r#"{"op":"profile","action":"start","seconds":60}"#;

    /// CPython's tracemalloc through the bridge: start, snapshot, stop
    /// ([`PyTraceReply`]).
    "python_trace" => PythonTrace {
        /// What to do (default: report the state).
        #[serde(default)]
        action: PyTraceAction,
        /// `start`: frames kept per allocation (1 to 64; default 1).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        frames: Option<u32>,
        /// `start`: the shim stops tracing after this many seconds (1 to
        /// 3600; default 60) if no `stop` came first.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seconds: Option<u64>,
        /// `snapshot`: lines returned (1 to 10000; default 100).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        top: Option<u32>,
    } -> Box<PyTraceReply>, Long, r#"{"op":"python_trace","action":"snapshot","top":10}"#;

    /// Stop the attached bridge's thread and close its socket
    /// ([`DetachResult`]); the answer comes first. A preloaded shim
    /// refuses it (`unsupported`): its thread is the process's allocator's.
    "detach" => Detach -> DetachResult, Short, r#"{"op":"detach"}"#;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_request;

    /// The golden test each declaration brings: its example decodes to a
    /// request of its `op` and encodes back to the very same bytes.
    #[test]
    fn every_declared_request_round_trips_its_example() {
        assert_eq!(EXAMPLES.len(), OPS.len());
        for (op, line) in EXAMPLES {
            let r = parse_request(line.as_bytes()).unwrap_or_else(|e| panic!("{line}: {e:?}"));
            assert_eq!(r.op(), *op, "{line}");
            assert_eq!(&serde_json::to_string(&r).unwrap(), line);
            assert_eq!(r.to_line(), format!("{line}\n").into_bytes());
        }
    }

    #[test]
    fn a_reply_of_another_kind_is_given_back() {
        let r = Reply::Purge(PurgeResult::default());
        assert_eq!(r.kind(), "purge");
        assert_eq!(PurgeResult::KIND, "purge");
        let back = DecayResult::from_reply(r.clone()).unwrap_err();
        assert_eq!(back, r);
        assert!(PurgeResult::from_reply(r).is_ok());
    }

    #[test]
    fn slow_requests_are_those_that_wait_for_python_or_the_profiler() {
        assert_eq!(Request::Purge.wait(), Wait::Short);
        assert_eq!(Request::Gc.wait(), Wait::Long);
        assert_eq!(
            Request::Stats {
                arenas: false,
                pss: false
            }
            .wait(),
            Wait::Short
        );
    }
}
