//! Where a process's control endpoint is, and the limits both sides check.
//! The library creates the socket from these facts; `memshim-ctl` and the
//! tests find it with them (docs/protocol.md, "Where the socket is").

use core::fmt;

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

impl fmt::Display for SocketName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}.sock", self.pid, self.starttime, self.pidns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
