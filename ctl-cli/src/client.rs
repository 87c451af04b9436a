//! Talking to one process's endpoint: connect, `hello`, requests, timeouts.

use crate::discover::{self, Proc, SocketLoc};
use crate::exit::{Exit, Failure};
use memshim_proto::{HelloReply, PROTOCOL_VERSION, Reply, Request, Response};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

/// Time limit for connecting and for simple requests.
const SHORT: Duration = Duration::from_secs(5);
/// Time limit for requests that may wait for Python (gc, empty_cache,
/// release): the shim waits at most 5 s for the interpreter, then works.
const LONG: Duration = Duration::from_secs(60);
/// `sun_path` holds 108 bytes, NUL included.
const SUN_PATH_MAX: usize = 107;

/// An open, greeted connection.
pub struct Client {
    reader: BufReader<UnixStream>,
    /// The process.
    pub proc: Proc,
    /// Where its socket is.
    pub loc: SocketLoc,
    /// Its `hello` answer.
    pub hello: HelloReply,
}

/// How a connection attempt failed, before any failure is built.
pub enum ConnectError {
    /// No file at the path.
    Missing,
    /// A file, but nobody listens: a stale socket.
    Refused,
    /// Not allowed.
    Permission,
    /// Anything else.
    Other(io::Error),
}

/// Connects to `path`; paths longer than `sun_path` go through
/// `/proc/self/fd/<dirfd>/<name>`.
pub fn connect_path(loc: &SocketLoc) -> Result<UnixStream, ConnectError> {
    let full = loc.path();
    let dir_handle;
    let target: PathBuf = if full.as_os_str().len() > SUN_PATH_MAX {
        dir_handle = std::fs::File::open(&loc.dir).map_err(classify)?;
        use std::os::fd::AsRawFd;
        PathBuf::from(format!(
            "/proc/self/fd/{}/{}",
            dir_handle.as_raw_fd(),
            loc.name
        ))
    } else {
        full
    };
    UnixStream::connect(&target).map_err(classify)
}

fn classify(e: io::Error) -> ConnectError {
    match e.kind() {
        io::ErrorKind::NotFound => ConnectError::Missing,
        io::ErrorKind::ConnectionRefused => ConnectError::Refused,
        io::ErrorKind::PermissionDenied => ConnectError::Permission,
        _ => ConnectError::Other(e),
    }
}

impl Client {
    /// Finds the shimmed process `pid`, connects and greets it.
    pub fn open(pid: i32) -> Result<Client, Failure> {
        let p = discover::shimmed(pid)?;
        Client::open_proc(p)
    }

    /// Connects to an already resolved process.
    pub fn open_proc(p: Proc) -> Result<Client, Failure> {
        let loc = discover::socket_loc(&p);
        let path = loc.path();
        let stream = match connect_path(&loc) {
            Ok(s) => s,
            Err(ConnectError::Missing) => {
                let (why, hint) = discover::why_no_endpoint(&p, &loc);
                return Err(Failure::new(Exit::NoEndpoint, Some(p.pid), why).hint(hint));
            }
            Err(ConnectError::Refused) => {
                return Err(Failure::new(
                    Exit::NoEndpoint,
                    Some(p.pid),
                    format!(
                        "{} exists but nobody answers (the endpoint is being re-created)",
                        path.display()
                    ),
                )
                .hint("retry in a few seconds"));
            }
            Err(ConnectError::Permission) => {
                return Err(discover::permission(&p, &path.display().to_string()));
            }
            Err(ConnectError::Other(e)) => {
                return Err(Failure::new(
                    Exit::Failed,
                    Some(p.pid),
                    format!("connecting to {}: {e}", path.display()),
                ));
            }
        };
        let _ = stream.set_read_timeout(Some(SHORT));
        let _ = stream.set_write_timeout(Some(SHORT));
        let mut c = Client {
            reader: BufReader::new(stream),
            hello: HelloReply {
                version: 0,
                min_version: 0,
                max_version: 0,
                pid: 0,
                starttime: 0,
                shim_version: String::new(),
                max_request_bytes: 0,
                ops: vec![],
            },
            proc: p,
            loc,
        };
        let client = Some(format!("memshim-ctl {}", env!("CARGO_PKG_VERSION")));
        match c.request(&Request::Hello {
            version: PROTOCOL_VERSION,
            client,
        })? {
            Reply::Hello(h) => c.hello = h,
            other => return Err(c.unexpected(&other)),
        }
        if c.hello.pid != c.proc.nspid || c.hello.starttime != c.proc.starttime {
            return Err(Failure::new(
                Exit::Remote,
                Some(c.proc.pid),
                format!(
                    "{} answered as pid {} started at {}, not pid {} started at {}; refusing to use it",
                    path.display(),
                    c.hello.pid,
                    c.hello.starttime,
                    c.proc.nspid,
                    c.proc.starttime
                ),
            ));
        }
        Ok(c)
    }

    /// Sends `req` and waits for its answer.
    pub fn request(&mut self, req: &Request) -> Result<Reply, Failure> {
        let slow = matches!(req, Request::Gc | Request::EmptyCache | Request::Release);
        let _ = self
            .reader
            .get_ref()
            .set_read_timeout(Some(if slow { LONG } else { SHORT }));
        let pid = self.proc.pid;
        let path = self.loc.path();
        let io_fail = |what: &str, e: io::Error| {
            let timeout = matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            );
            Failure::new(
                Exit::Failed,
                Some(pid),
                if timeout {
                    format!("{what} {}: no answer in time", path.display())
                } else {
                    format!("{what} {}: {e}", path.display())
                },
            )
        };
        // A server that refuses us (permission, busy) may have answered and
        // closed already: on a write error, still read what it said.
        let wrote = self.reader.get_mut().write_all(&req.to_line());
        let mut line = Vec::new();
        let limit = memshim_proto::MAX_RESPONSE_BYTES as u64;
        let read = (&mut self.reader).take(limit).read_until(b'\n', &mut line);
        if line.is_empty() {
            if let Err(e) = wrote {
                return Err(io_fail("writing to", e));
            }
            read.map_err(|e| io_fail("reading from", e))?;
            return Err(io_fail(
                "reading from",
                io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed"),
            ));
        }
        match Response::from_line(&line) {
            Ok(Response::Ok(r)) => Ok(r),
            Ok(Response::Error(e)) => Err(remote_failure(pid, &e)),
            Err(e) => Err(Failure::new(
                Exit::Remote,
                Some(pid),
                format!("undecodable answer from {}: {e}", path.display()),
            )
            .hint("use a memshim-ctl of the same release as the library")),
        }
    }

    /// The failure for a reply of the wrong kind.
    pub fn unexpected(&self, r: &Reply) -> Failure {
        let kind = serde_json::to_value(r)
            .ok()
            .and_then(|v| v["kind"].as_str().map(str::to_owned))
            .unwrap_or_default();
        Failure::new(
            Exit::Remote,
            Some(self.proc.pid),
            format!("unexpected {kind:?} answer"),
        )
    }
}

/// The failure for an error answer, with what to do where we know it.
pub fn remote_failure(pid: i32, e: &memshim_proto::ErrorReply) -> Failure {
    use memshim_proto::{ErrorCode, PythonUnavailable as U};
    let exit = match e.code {
        ErrorCode::PermissionDenied => Exit::Permission,
        ErrorCode::PythonUnavailable => Exit::PythonStep,
        _ => Exit::Remote,
    };
    let f = Failure::new(exit, Some(pid), e.to_string());
    match &e.python {
        Some(U::Busy { .. }) => f.hint(
            "a C extension held the GIL for the whole wait (or an earlier job is still running); try again",
        ),
        Some(U::NoPython) => f.hint(
            "the process has no CPython in its global scope (not a Python process, or one that embeds Python RTLD_LOCAL)",
        ),
        Some(U::Unsupported { .. }) => f.hint("the bridge supports CPython 3.8 to 3.13"),
        _ => f,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixListener;

    #[test]
    fn connects_to_paths_longer_than_sun_path() {
        let mut dir = std::env::temp_dir().join(format!("memshim-ctl-test-{}", std::process::id()));
        while dir.as_os_str().len() < 140 {
            dir.push("a-rather-long-directory-name");
        }
        std::fs::create_dir_all(&dir).unwrap();
        let name = "4242-99999.sock";
        assert!(dir.join(name).as_os_str().len() > SUN_PATH_MAX);
        let handle = std::fs::File::open(&dir).unwrap();
        let listener =
            UnixListener::bind(format!("/proc/self/fd/{}/{name}", handle.as_raw_fd())).unwrap();
        let loc = SocketLoc {
            dir_inside: dir.clone(),
            dir: dir.clone(),
            name: name.into(),
        };
        let stream =
            connect_path(&loc).unwrap_or_else(|_| panic!("connect to {}", loc.path().display()));
        assert!(listener.accept().is_ok());
        drop(stream);
        let top = std::env::temp_dir().join(format!("memshim-ctl-test-{}", std::process::id()));
        std::fs::remove_dir_all(top).unwrap();
    }
}
