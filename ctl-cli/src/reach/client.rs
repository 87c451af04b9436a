//! Talking to one process's endpoint through the protocol client of
//! `memshim-proto` (the one the tests use too), with what failed said for
//! a person: which pid, which path, what to do.

use crate::exit::{self, Failure};
use crate::reach::no_endpoint;
use crate::reach::procfs::{self, Proc};
use crate::reach::socket::{self, SocketLoc};
use memshim_proto::client::{ClientError, ConnectError, Connection};
use memshim_proto::{Answer, HelloReply, Reply, Request, Response, StatsReport, Wait};
use std::time::Duration;

pub use memshim_proto::client::connect;

/// Time limit for connecting and for simple requests.
const SHORT: Duration = Duration::from_secs(5);
/// Time limit for requests declared [`Wait::Long`] (those that may wait
/// for Python or the profiler): the shim waits at most 5 s for the
/// interpreter, then works.
const LONG: Duration = Duration::from_secs(60);

/// How long a connection that broke in the middle of a request may take to
/// turn out to be a process that exited (`procfs::exits_within`); only a
/// process that is still running after it makes that error wait this long.
const GONE_WAIT: Duration = Duration::from_secs(1);

/// How many times a connection closed with `busy` before its `hello` was
/// read is made again ([`Client::open_proc`]).
const EVICTED_RETRIES: u32 = 8;

/// The pause before connecting again after `busy`: doubling from 50 ms
/// to at most 500 ms (about 3 s over [`EVICTED_RETRIES`] attempts), plus up
/// to 40 ms spread by pid and time so that a burst does not come back at
/// once.
fn pause_before_retry(attempt: u32) {
    let spread = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::from(d.subsec_nanos()))
        ^ u64::from(std::process::id());
    let base = (25u64 << attempt.min(5)).min(500);
    std::thread::sleep(Duration::from_millis(base + spread % 40));
}

/// Why [`Client::open_once`] has no connection.
enum Opened {
    /// The endpoint closed it with `busy` (too many connections at once).
    Evicted(Failure),
    /// Anything else.
    Failed(Failure),
}

impl From<Failure> for Opened {
    fn from(f: Failure) -> Opened {
        Opened::Failed(f)
    }
}

/// An open, greeted connection.
pub struct Client {
    conn: Connection,
    /// The process.
    pub proc: Proc,
    /// Where its socket is.
    pub loc: SocketLoc,
    /// Its `hello` answer.
    pub hello: HelloReply,
}

impl Client {
    /// Finds the shimmed process `pid`, connects and greets it.
    pub fn open(pid: i32) -> Result<Client, Failure> {
        let p = procfs::shimmed(pid)?;
        Client::open_proc(p)
    }

    /// Connects to an already resolved process. A burst of clients beyond
    /// the endpoint's 16 connections gets the oldest closed with `busy`
    /// before its `hello` was read (docs/protocol.md); such a client
    /// connects again after a short pause, spread by pid and time, up to
    /// [`EVICTED_RETRIES`] times.
    pub fn open_proc(p: Proc) -> Result<Client, Failure> {
        let mut attempt = 0;
        loop {
            match Client::open_once(p.clone()) {
                Err(Opened::Evicted(_)) if attempt < EVICTED_RETRIES => {
                    attempt += 1;
                    pause_before_retry(attempt);
                }
                Err(Opened::Evicted(f) | Opened::Failed(f)) => return Err(f),
                Ok(c) => return Ok(c),
            }
        }
    }

    fn open_once(p: Proc) -> Result<Client, Opened> {
        let loc = socket::locate(&p);
        let path = loc.path();
        // Asking would only wait out the time limit: `list`, `cgroup`,
        // `reclaim` ask each process in turn.
        if procfs::shim_thread_stopped(p.pid) {
            return Err(stopped(p.pid, &path.display().to_string()).into());
        }
        if procfs::frozen(p.pid) {
            return Err(frozen(p.pid, &path.display().to_string()).into());
        }
        let conn = match Connection::open(&loc.dir, &loc.name, SHORT) {
            Ok(c) => c,
            // Found a moment ago, gone now: its socket is missing or stale.
            Err(ConnectError::Missing | ConnectError::Refused) if !procfs::still_running(&p) => {
                return Err(exited(&p, &path.display().to_string(), "no answer").into());
            }
            Err(ConnectError::Missing) => {
                let (why, hint) = no_endpoint::why(&p, &loc);
                return Err(Failure::new(exit::NO_ENDPOINT, Some(p.pid), why)
                    .hint(hint)
                    .into());
            }
            Err(ConnectError::Refused) => {
                let (why, hint) = no_endpoint::why(&p, &loc);
                // Not a socket at all: `why` names what is there. Else the
                // file outlived its listener: the program this process ran
                // before an `exec` left it (the name stays the same), or
                // the shim's thread is stopping this instant.
                let why = if no_endpoint::not_a_socket(&path).is_some() {
                    why
                } else {
                    format!(
                        "{} is left over, nobody listens on it (from before an exec, or a thread that was \
                         stopping); {why}",
                        path.display()
                    )
                };
                return Err(Failure::new(exit::NO_ENDPOINT, Some(p.pid), why)
                    .hint(hint)
                    .into());
            }
            Err(ConnectError::Permission) => {
                return Err(procfs::permission(&p, &path.display().to_string()).into());
            }
            Err(ConnectError::Other(e)) => {
                return Err(Failure::new(
                    exit::FAILED,
                    Some(p.pid),
                    format!("connecting to {}: {e}", path.display()),
                )
                .into());
            }
        };
        let pid = p.pid;
        let mut c = Client {
            conn,
            hello: HelloReply {
                version: 0,
                min_version: 0,
                max_version: 0,
                pid: 0,
                starttime: 0,
                pidns: None,
                shim_version: String::new(),
                max_request_bytes: 0,
                ops: vec![],
            },
            proc: p,
            loc,
        };
        let client = Some(format!("memshim-ctl {}", env!("CARGO_PKG_VERSION")));
        match c.conn.hello(client).map_err(|e| c.io_failure(&e))? {
            Ok(h) => c.hello = h,
            Err(Response::Error(e)) if e.code == memshim_proto::ErrorCode::Busy => {
                return Err(Opened::Evicted(remote_failure(pid, &e)));
            }
            Err(Response::Error(e)) => return Err(remote_failure(pid, &e).into()),
            Err(Response::Ok(other)) => return Err(c.unexpected(&other).into()),
        }
        if !socket::hello_matches(&c.hello, &c.proc) {
            return Err(Failure::new(
                exit::REMOTE,
                Some(c.proc.pid),
                format!(
                    "{} answered as pid {} started at {}, not pid {} started at {}; refusing to use it",
                    path.display(),
                    c.hello.pid,
                    c.hello.starttime,
                    c.proc.nspid,
                    c.proc.starttime
                ),
            )
            .into());
        }
        Ok(c)
    }

    fn io_failure(&self, e: &ClientError) -> Failure {
        let path = self.loc.path();
        if !e.timed_out() && procfs::exits_within(&self.proc, GONE_WAIT) {
            return exited(&self.proc, &path.display().to_string(), &e.to_string());
        }
        match e {
            ClientError::Undecodable(_) => Failure::new(
                exit::REMOTE,
                Some(self.proc.pid),
                format!("{e} from {}", path.display()),
            )
            .hint("use a memshim-ctl of the same release as the library"),
            _ if e.timed_out() && procfs::stopped(self.proc.pid) => {
                stopped(self.proc.pid, &format!("{}: {e}", path.display()))
            }
            // The shim's thread closed its socket under us: it stops when
            // the process has been single-threaded for a while. The
            // connection was still waiting in its queue, so it breaks.
            _ if connection_lost(e)
                && matches!(
                    connect(&self.loc.dir, &self.loc.name),
                    Err(ConnectError::Missing | ConnectError::Refused)
                ) =>
            {
                let (why, hint) = no_endpoint::why(&self.proc, &self.loc);
                Failure::new(
                    exit::NO_ENDPOINT,
                    Some(self.proc.pid),
                    format!(
                        "{}: {e}: the shim's thread stopped listening while memshim-ctl talked to it; {why}",
                        path.display()
                    ),
                )
                .hint(hint)
            }
            // ... and listens again already: the thread started again with
            // the process's next thread, or an `exec` replaced the program
            // (the socket's name stays the same).
            _ if connection_lost(e) => Failure::new(
                exit::NO_ENDPOINT,
                Some(self.proc.pid),
                format!(
                    "{}: {e}: the connection broke while the process runs, and its socket listens again (the \
                     shim's thread stopped and started again with a new thread, or the process exec'ed); the \
                     request got no answer",
                    path.display()
                ),
            )
            .hint("ask again"),
            _ => Failure::new(
                exit::FAILED,
                Some(self.proc.pid),
                format!("{}: {e}", path.display()),
            ),
        }
    }

    /// Sends `req` and waits for its answer. A connection closed with
    /// `busy` (a burst of clients beyond the endpoint's 16 connections)
    /// was closed unread, so the request did not run: it is sent again on
    /// a new connection, as in [`Client::open_proc`].
    pub fn request(&mut self, req: &Request) -> Result<Reply, Failure> {
        let limit = match req.wait() {
            Wait::Short => SHORT,
            Wait::Long => LONG,
        };
        let mut attempt = 0;
        loop {
            self.conn.set_timeout(limit);
            match self.conn.request(req).map_err(|e| self.io_failure(&e))? {
                Response::Ok(r) => return Ok(r),
                Response::Error(e)
                    if e.code == memshim_proto::ErrorCode::Busy && attempt < EVICTED_RETRIES =>
                {
                    attempt += 1;
                    pause_before_retry(attempt);
                    *self = Client::open_proc(self.proc.clone())?;
                }
                Response::Error(e) => return Err(remote_failure(self.proc.pid, &e)),
            }
        }
    }

    /// Sends `req` and returns its answer as `R`, the reply payload that
    /// `req`'s declaration names (proto's `requests!`); an answer of
    /// another kind is a failure.
    pub fn ask<R: Answer>(&mut self, req: &Request) -> Result<R, Failure> {
        debug_assert_eq!(
            R::KIND,
            req.op(),
            "asked {} for a {} reply",
            req.op(),
            R::KIND
        );
        let r = self.request(req)?;
        R::from_reply(r).map_err(|other| self.unexpected(&other))
    }

    /// `stats` of the process (no arenas, no PSS).
    pub fn stats(&mut self) -> Result<Box<StatsReport>, Failure> {
        self.ask(&Request::Stats {
            arenas: false,
            pss: false,
        })
    }

    /// The failure for a reply of the wrong kind.
    fn unexpected(&self, r: &Reply) -> Failure {
        Failure::new(
            exit::REMOTE,
            Some(self.proc.pid),
            format!("unexpected {:?} answer", r.kind()),
        )
    }
}

/// Whether the server's side of the connection went away (rather than the
/// answer being late or garbled).
fn connection_lost(e: &ClientError) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
    match e {
        ClientError::Closed => true,
        ClientError::Write(e) | ClientError::Read(e) => {
            matches!(e.kind(), BrokenPipe | ConnectionReset | ConnectionAborted)
        }
        ClientError::Undecodable(_) => false,
    }
}

/// The failure for a process that is stopped: `what` is the socket, or
/// what failed on it.
fn stopped(pid: i32, what: &str) -> Failure {
    Failure::new(
        exit::FAILED,
        Some(pid),
        format!(
            "{what}: the process is stopped (SIGSTOP, a job-control stop or a debugger), so nothing in it runs"
        ),
    )
    .hint(format!("continue it (`kill -CONT {pid}`) and ask again"))
}

/// The failure for a process its cgroup's freezer holds.
fn frozen(pid: i32, what: &str) -> Failure {
    Failure::new(
        exit::FAILED,
        Some(pid),
        format!(
            "{what}: the process is frozen by its cgroup's freezer (`docker pause`, cgroup.freeze, \
             freezer.state), so nothing in it runs"
        ),
    )
    .hint("thaw it (`docker unpause`, 0 in cgroup.freeze, THAWED in freezer.state) and ask again")
}

/// The failure for a process that exited while memshim-ctl talked to it.
fn exited(p: &Proc, path: &str, what: &str) -> Failure {
    Failure::new(
        exit::NOT_FOUND,
        Some(p.pid),
        format!("the process exited while memshim-ctl talked to it ({path}: {what})"),
    )
    .hint("check the pid with `memshim-ctl list`")
}

/// The failure for an error answer, with what to do where we know it.
pub fn remote_failure(pid: i32, e: &memshim_proto::ErrorReply) -> Failure {
    use memshim_proto::{ErrorCode, PythonUnavailable as U};
    let exit = match e.code {
        ErrorCode::PermissionDenied => exit::PERMISSION,
        ErrorCode::PythonUnavailable => exit::PYTHON_STEP,
        ErrorCode::ProfilingOff => exit::NO_PROFILER,
        _ => exit::REMOTE,
    };
    let f = Failure::new(exit, Some(pid), e.to_string());
    match &e.python {
        Some(U::Busy { .. }) => f.hint(
            "a C extension held the GIL for the whole wait (or an earlier job is still running); try again",
        ),
        Some(U::NoPython) => f.hint(
            "the process has no CPython in its global scope (not a Python process, or one that embeds Python RTLD_LOCAL)",
        ),
        Some(U::Unsupported { .. }) => f.hint(format!(
            "the bridge supports {}",
            memshim_proto::python_served_text()
        )),
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
        let name = "4242-99999-1.sock";
        assert!(dir.join(name).as_os_str().len() > memshim_proto::SUN_PATH_MAX);
        let handle = std::fs::File::open(&dir).unwrap();
        let listener =
            UnixListener::bind(format!("/proc/self/fd/{}/{name}", handle.as_raw_fd())).unwrap();
        let stream = connect(&dir, name)
            .unwrap_or_else(|e| panic!("connect to {}/{name}: {e}", dir.display()));
        assert!(listener.accept().is_ok());
        drop(stream);
        let top = std::env::temp_dir().join(format!("memshim-ctl-test-{}", std::process::id()));
        std::fs::remove_dir_all(top).unwrap();
    }
}
