//! Reaching a process's control endpoint from a test: where its socket is
//! (the facts of `memshim_proto::endpoint`, the library's own) and a
//! connection speaking the protocol through `memshim_proto::client`, the
//! client `memshim-ctl` uses.

use memshim_proto::client::Connection;
use memshim_proto::endpoint::SocketName;
use memshim_proto::{Request, Response};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long any read or write on a test's connection may take.
const IO_LIMIT: Duration = Duration::from_secs(10);

/// Field 22 of `/proc/<pid>/stat`, if the process exists.
pub fn starttime(pid: i32) -> Option<u64> {
    let s = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    memshim_proto::procfs::stat_starttime(&s)
}

/// The inode of `/proc/<pid>/ns/pid`, if readable.
pub fn pid_namespace(pid: i32) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|m| m.ino())
}

/// The socket file name of `pid` (a process in our pid namespace).
pub fn socket_name(pid: i32) -> Option<String> {
    socket_name_inside(pid, pid)
}

/// The socket file name of the process we see as `host_pid`, whose pid in
/// its own pid namespace is `pid_inside`.
pub fn socket_name_inside(pid_inside: i32, host_pid: i32) -> Option<String> {
    Some(
        SocketName {
            pid: pid_inside,
            starttime: starttime(host_pid)?,
            pidns: pid_namespace(host_pid)?,
        }
        .to_string(),
    )
}

/// `<dir>/<socket name of pid>`.
pub fn socket_path(dir: &Path, pid: i32) -> Option<PathBuf> {
    Some(dir.join(socket_name(pid)?))
}

/// Waits (at most `timeout`) until `pid`'s socket exists in `dir` as a
/// socket, and returns its path. ([`socket_path`] only computes the name.)
pub fn wait_socket(dir: &Path, pid: i32, timeout: Duration) -> Option<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    crate::wait_until(timeout, || {
        let p = socket_path(dir, pid)?;
        let socket = std::fs::symlink_metadata(&p).ok()?.file_type().is_socket();
        socket.then_some(p)
    })
}

/// The default socket directory of this test process's effective uid.
pub fn default_dir() -> PathBuf {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let uid: u32 = s
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|u| u.parse().ok())
        .unwrap();
    PathBuf::from(memshim_proto::endpoint::default_socket_dir(uid))
}

/// A connection to an endpoint, with bounded waits.
pub struct Conn(pub Connection);

impl Conn {
    /// Connects to `path`, without `hello`.
    pub fn try_connect(path: &Path) -> std::io::Result<Conn> {
        let s = std::os::unix::net::UnixStream::connect(path)?;
        let c = Connection::from_stream(s);
        c.set_timeout(IO_LIMIT);
        Ok(Conn(c))
    }

    /// Connects to `path`, without `hello`; panics if it cannot.
    pub fn connect(path: &Path) -> Conn {
        Conn::try_connect(path).unwrap_or_else(|e| panic!("connect {}: {e}", path.display()))
    }

    /// Connects to `path` and says hello.
    pub fn open(path: &Path) -> Result<Conn, String> {
        let mut c = Conn::try_connect(path).map_err(|e| e.to_string())?;
        let v = c.ask(r#"{"op":"hello","version":1,"client":"memshim-tests"}"#)?;
        if v.get("ok").is_none() {
            return Err(format!("hello refused: {v}"));
        }
        Ok(c)
    }

    /// Waits (at most 10 s) for `pid`'s socket in `dir`, connects, says hello.
    pub fn to_pid(dir: &Path, pid: i32) -> Result<Conn, String> {
        let mut last = String::new();
        crate::wait_until(Duration::from_secs(10), || {
            let Some(p) = socket_path(dir, pid) else {
                return Some(Err(format!("process {pid} is gone")));
            };
            Conn::open(&p)
                .map_err(|e| last = format!("{}: {e}", p.display()))
                .ok()
                .map(Ok)
        })
        .unwrap_or(Err(last))
    }

    /// Writes bytes as they are.
    pub fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.0.send_raw(bytes)
    }

    /// Reads one answer line ("" at end of file or on a timeout).
    pub fn line(&mut self) -> String {
        String::from_utf8_lossy(&self.0.read_line().unwrap_or_default()).into_owned()
    }

    /// One request line (without its `\n`), one answer.
    pub fn ask(&mut self, line: &str) -> Result<serde_json::Value, String> {
        self.0.ask(line).map_err(|e| e.to_string())
    }

    /// `hello`; panics without an answer.
    pub fn hello(&mut self) -> serde_json::Value {
        self.ask(r#"{"op":"hello","version":1}"#)
            .unwrap_or_else(|e| panic!("hello: {e}"))
    }

    /// One typed request.
    pub fn request(&mut self, req: &Request) -> Result<Response, String> {
        self.0.request(req).map_err(|e| e.to_string())
    }
}
