//! Where a process's control endpoint is, and the limits both sides check.
//! The library creates the socket from these facts; `memshim-ctl` and the
//! tests find it with them (docs/protocol.md, "Where the socket is").

use core::fmt;
use serde::{Deserialize, Serialize};

/// The default socket directory is this prefix followed by the effective
/// uid: `/tmp/memshim-<euid>`.
pub const SOCKET_DIR_PREFIX: &str = "/tmp/memshim-";

/// Longest socket directory accepted (`MEMSHIM_SOCKET_DIR`).
pub const MAX_SOCKET_DIR: usize = 72;

/// Longest path `connect`/`bind` take (`sun_path` less its NUL). Both sides
/// reach a longer `<dir>/<name>` through the directory's descriptor:
/// `/proc/self/fd/<dirfd>/<name>`.
pub const SUN_PATH_MAX: usize = 107;

/// The decay value that means "never purge".
pub const DECAY_NEVER: i64 = -1;

/// Largest decay accepted, by the library's settings and by the `decay`
/// request (about 31 years; jemalloc's own bound is larger).
pub const MAX_DECAY_MS: i64 = 1_000_000_000_000;

/// Largest arena count accepted (`MEMSHIM_NARENAS`, `memshim-ctl run
/// --narenas`): jemalloc 5.3 reduces anything above 4094 (its arena limit,
/// MALLOCX_ARENA_LIMIT 4095, less one) with a warning of its own.
pub const MAX_NARENAS: u32 = 4094;

/// The default socket directory of a process whose effective uid is `euid`.
pub fn default_socket_dir(euid: u32) -> String {
    format!("{SOCKET_DIR_PREFIX}{euid}")
}

/// Whether `dir` may be a socket directory: absolute, at most
/// [`MAX_SOCKET_DIR`] bytes, no NUL.
pub fn valid_socket_dir(dir: &[u8]) -> bool {
    dir.first() == Some(&b'/') && dir.len() <= MAX_SOCKET_DIR && !dir.contains(&0)
}

/// Whether `ms` is a decay time both sides accept: [`DECAY_NEVER`] or
/// `0..=MAX_DECAY_MS`.
pub fn valid_decay_ms(ms: i64) -> bool {
    ms == DECAY_NEVER || (0..=MAX_DECAY_MS).contains(&ms)
}

/// The file name of a process's socket: `<pid>-<starttime>-<pidns>.sock`.
///
/// * `pid`: the process id in the process's own pid namespace (the last
///   `NSpid` entry of `/proc/<pid>/status`, seen from outside);
/// * `starttime`: field 22 of `/proc/<pid>/stat`, which tells a process
///   from an earlier one that had the same pid;
/// * `pidns`: the inode number of `/proc/<pid>/ns/pid`, which tells apart
///   two processes with the same pid and start time in two pid namespaces
///   (two containers' pid 1, started in the same clock tick) that share
///   the socket directory.
///
/// [`SocketName::parse`] also reads the `<pid>-<starttime>.sock` names of
/// releases before the pid namespace was part of the name (`pidns` 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketName {
    /// Pid in the process's own pid namespace.
    pub pid: i32,
    /// Start time in clock ticks after boot.
    pub starttime: u64,
    /// Inode of the process's pid namespace; 0 if unknown.
    pub pidns: u64,
}

impl SocketName {
    /// Reads a file name written by [`SocketName`]'s `Display`, or an older
    /// `<pid>-<starttime>.sock`.
    pub fn parse(name: &str) -> Option<SocketName> {
        let stem = name.strip_suffix(".sock")?;
        let mut parts = stem.split('-');
        let pid = parts.next()?.parse().ok()?;
        let starttime = parts.next()?.parse().ok()?;
        let pidns = match parts.next() {
            Some(p) => p.parse().ok()?,
            None => 0,
        };
        parts.next().is_none().then_some(SocketName {
            pid,
            starttime,
            pidns,
        })
    }
}

impl SocketName {
    /// Whether `name` is exactly what a shim writes for `self` (or a release
    /// before the pid namespace was in the name wrote): `0042-7-9.sock`
    /// parses, but no shim made it.
    pub fn written_as(&self, name: &str) -> bool {
        let old = SocketName { pidns: 0, ..*self };
        name == self.to_string()
            || (self.pidns == 0 && name == format!("{}-{}.sock", old.pid, old.starttime))
    }

    /// The stale-socket rule, the one the shim (after binding its own) and
    /// `memshim-ctl list` apply: the file `name` in a socket directory may
    /// go if it is named exactly as a shim names one ([`written_as`],
    /// with a start time), of the pid namespace `pidns` (`None`: any), and
    /// `seen`, what this `/proc` says of its pid, is that no such process
    /// is there or that the pid now belongs to a process with another start
    /// time (a reused pid). A live process of that pid and start time
    /// manages its own file; a `/proc` that could not be read keeps it.
    /// The caller then removes the file only if it is a socket and
    /// connecting to it is refused: nobody listens.
    ///
    /// [`written_as`]: SocketName::written_as
    pub fn stale(name: &str, pidns: Option<u64>, seen: impl FnOnce(i32) -> Seen) -> bool {
        let Some(s) = SocketName::parse(name) else {
            return false;
        };
        if !s.written_as(name) || s.starttime == 0 || pidns.is_some_and(|ns| ns != s.pidns) {
            return false;
        }
        match seen(s.pid) {
            Seen::Gone => true,
            Seen::Started(t) => t != s.starttime,
            Seen::Unknown => false,
        }
    }
}

/// What a `/proc` says of a pid, for [`SocketName::stale`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// No such process (`ENOENT`, `ESRCH`).
    Gone,
    /// A process that started at this time (field 22 of its `stat`).
    Started(u64),
    /// Its `stat` could not be read or parsed.
    Unknown,
}

impl fmt::Display for SocketName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}.sock", self.pid, self.starttime, self.pidns)
    }
}

/// The answer to `hello`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct HelloReply {
    /// Protocol version used on this connection from now on.
    pub version: u32,
    /// Oldest version the server speaks.
    pub min_version: u32,
    /// Newest version the server speaks.
    pub max_version: u32,
    /// The process id as the process itself sees it (its own pid namespace).
    pub pid: i32,
    /// Field 22 of `/proc/self/stat` (clock ticks after boot): with `pid`,
    /// tells a reused pid from the process that created the socket.
    pub starttime: u64,
    /// Inode number of the process's pid namespace (`/proc/self/ns/pid`):
    /// with `pid` and `starttime`, tells two containers' pid 1 apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pidns: Option<u64>,
    /// libmemshim version.
    pub shim_version: String,
    /// Longest request line accepted, `\n` included.
    pub max_request_bytes: u64,
    /// Requests this server understands.
    pub ops: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_is_stale_when_its_process_is_gone_or_its_pid_reused() {
        let seen = |v: Seen| move |_| v;
        let name = "42-7-9.sock";
        assert!(SocketName::stale(name, Some(9), seen(Seen::Gone)));
        assert!(SocketName::stale(name, None, seen(Seen::Started(8))));
        assert!(!SocketName::stale(name, Some(9), seen(Seen::Started(7))));
        assert!(!SocketName::stale(name, Some(9), seen(Seen::Unknown)));
        // Another pid namespace, a name no shim wrote, no start time.
        assert!(!SocketName::stale(name, Some(10), seen(Seen::Gone)));
        assert!(!SocketName::stale("042-7-9.sock", None, seen(Seen::Gone)));
        assert!(!SocketName::stale("42-0-9.sock", None, seen(Seen::Gone)));
        assert!(!SocketName::stale("x.sock", None, seen(Seen::Gone)));
        // An older release's name (no pid namespace).
        assert!(SocketName::stale("42-7.sock", None, seen(Seen::Gone)));
        assert!(!SocketName::stale("42-7.sock", Some(9), seen(Seen::Gone)));
    }

    #[test]
    fn socket_names_round_trip_and_old_names_still_parse() {
        let n = SocketName {
            pid: 1,
            starttime: 212035,
            pidns: 4026531836,
        };
        assert_eq!(n.to_string(), "1-212035-4026531836.sock");
        assert_eq!(SocketName::parse(&n.to_string()), Some(n));
        assert_eq!(
            SocketName::parse("42-7.sock"),
            Some(SocketName {
                pid: 42,
                starttime: 7,
                pidns: 0
            })
        );
        for bad in [
            "42.sock",
            "42-x.sock",
            "42-7-8-9.sock",
            "42-7-8",
            "-1-2.sockx",
        ] {
            assert_eq!(SocketName::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn limits() {
        assert!(valid_socket_dir(b"/run/memshim"));
        assert!(!valid_socket_dir(b"relative/dir"));
        assert!(!valid_socket_dir(&[b'/'; MAX_SOCKET_DIR + 1]));
        assert!(!valid_socket_dir(b"/a\0b"));
        assert!(valid_decay_ms(DECAY_NEVER) && valid_decay_ms(0) && valid_decay_ms(MAX_DECAY_MS));
        assert!(!valid_decay_ms(-2) && !valid_decay_ms(MAX_DECAY_MS + 1));
        assert_eq!(default_socket_dir(0), "/tmp/memshim-0");
    }
}
