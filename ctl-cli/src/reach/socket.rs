//! Where a process's control socket is, and whether an answer on it comes
//! from that process.
//!
//! The socket is `<dir>/<nspid>-<starttime>-<pidns>.sock`
//! (`memshim_proto::endpoint`), where `<dir>` is the process's
//! `MEMSHIM_SOCKET_DIR` (from `/proc/<pid>/environ`, checked as the shim
//! checks it) or `/tmp/memshim-<euid>`, `<nspid>` is the last `NSpid` entry
//! of `/proc/<pid>/status` (the pid inside the process's own pid
//! namespace), `<starttime>` is field 22 of `/proc/<pid>/stat` and `<pidns>`
//! the inode of `/proc/<pid>/ns/pid`. A file with the right pid but another
//! start time belongs to an earlier process that had the same pid, and is
//! never used.
//!
//! A process in another mount namespace (a container) is reached through
//! `/proc/<pid>/root/<dir>` (needs root or ptrace rights). Its euid is
//! translated through `/proc/<pid>/uid_map` when it has its own user
//! namespace.

use crate::reach::procfs::{self, Environ, Proc};
use memshim_proto::endpoint::{self, SocketName};
use memshim_proto::settings;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Where a process's control socket is.
#[derive(Debug, Clone)]
pub struct SocketLoc {
    /// The directory as the process sees it.
    pub dir_inside: PathBuf,
    /// The directory as we reach it (`/proc/<pid>/root/...` across mount
    /// namespaces).
    pub dir: PathBuf,
    /// `<nspid>-<starttime>-<pidns>.sock`.
    pub name: String,
}

impl SocketLoc {
    /// Full path as we reach it.
    pub fn path(&self) -> PathBuf {
        self.dir.join(&self.name)
    }
}

/// The socket directory a `MEMSHIM_SOCKET_DIR` value names, if the shim
/// accepts it (`memshim_proto::endpoint::valid_socket_dir`: absolute, at
/// most 72 bytes); the shim uses its default directory otherwise.
pub fn configured_dir(value: &[u8]) -> Option<PathBuf> {
    endpoint::valid_socket_dir(value).then(|| PathBuf::from(OsStr::from_bytes(value)))
}

/// The socket directory the shim in `p` uses, and how we reach it.
pub fn locate(p: &Proc) -> SocketLoc {
    let dir_inside = Environ::read(&p.view)
        .and_then(|env| configured_dir(env.get_bytes(settings::SOCKET_DIR.name)?))
        .unwrap_or_else(|| {
            PathBuf::from(endpoint::default_socket_dir(procfs::uid_inside(
                p.pid, p.uid,
            )))
        });
    let dir = if procfs::same_mount_ns(&p.view) {
        dir_inside.clone()
    } else {
        p.view
            .join("root")
            .join(dir_inside.strip_prefix("/").unwrap_or(&dir_inside))
    };
    let name = socket_name(p, &dir);
    SocketLoc {
        dir_inside,
        dir,
        name,
    }
}

/// The file name of `p`'s socket. Without the pid namespace (no permission
/// to read `/proc/<pid>/ns/pid`), the one file in `dir` with `p`'s pid and
/// start time, if there is exactly one.
fn socket_name(p: &Proc, dir: &Path) -> String {
    let want = SocketName {
        pid: p.nspid,
        starttime: p.starttime,
        pidns: p.pidns,
    };
    if p.pidns != 0 {
        return want.to_string();
    }
    let candidates: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| {
                    SocketName::parse(n)
                        .is_some_and(|s| s.pid == p.nspid && s.starttime == p.starttime)
                })
                .collect()
        })
        .unwrap_or_default();
    match &candidates[..] {
        [one] => one.clone(),
        _ => want.to_string(),
    }
}

/// Whether a `hello` answer comes from the process `p`.
pub fn hello_matches(h: &memshim_proto::HelloReply, p: &Proc) -> bool {
    h.pid == p.nspid
        && h.starttime == p.starttime
        && (p.pidns == 0 || h.pidns.is_none_or(|n| n == p.pidns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_socket_is_named_for_pid_start_time_and_pid_namespace() {
        let p = procfs::read_proc(std::process::id() as i32).unwrap();
        let loc = locate(&p);
        assert_eq!(
            loc.name,
            format!("{}-{}-{}.sock", p.nspid, p.starttime, p.pidns)
        );
    }

    #[test]
    fn socket_directories_are_checked_as_the_shim_checks_them() {
        assert_eq!(
            configured_dir(b"/run/memshim"),
            Some(PathBuf::from("/run/memshim"))
        );
        assert_eq!(
            configured_dir(b"/a/\xff"),
            Some(PathBuf::from(OsStr::from_bytes(b"/a/\xff")))
        );
        for bad in [&b""[..], b"relative/dir", &[b'/'; 73]] {
            assert_eq!(configured_dir(bad), None, "{bad:?}");
        }
    }
}
