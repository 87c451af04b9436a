//! The protocol client used by `memshim-ctl` and the tests: connecting
//! (also to paths longer than `sun_path`), `hello`, one request at a time,
//! bounded waits. Feature `client`; the library does not build it.

use crate::{HelloReply, MAX_RESPONSE_BYTES, PROTOCOL_VERSION, Reply, Request, Response};
use std::cell::Cell;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Why a connection could not be made.
#[derive(Debug)]
pub enum ConnectError {
    /// No file at the path (or a component of the directory is not a
    /// directory, so there cannot be one).
    Missing,
    /// A file, but nobody listens: a stale socket, or one being re-created.
    Refused,
    /// Not allowed.
    Permission,
    /// Anything else.
    Other(io::Error),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Missing => f.write_str("no such socket"),
            ConnectError::Refused => f.write_str("connection refused"),
            ConnectError::Permission => f.write_str("permission denied"),
            ConnectError::Other(e) => write!(f, "{e}"),
        }
    }
}

fn classify(e: io::Error) -> ConnectError {
    match e.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory => ConnectError::Missing,
        io::ErrorKind::ConnectionRefused => ConnectError::Refused,
        io::ErrorKind::PermissionDenied => ConnectError::Permission,
        _ => ConnectError::Other(e),
    }
}

/// Connects to `dir/name`, which must be a socket itself: a symbolic link
/// is never followed, so a process's user cannot point memshim-ctl (run
/// by root, say) at another socket by planting a link in its own socket
/// directory. The file is opened without following links (`O_PATH |
/// O_NOFOLLOW`), checked to be a socket, and connected to through that
/// descriptor (`/proc/self/fd/<n>`), so it cannot be swapped in between;
/// this also reaches paths longer than `sun_path`.
pub fn connect(dir: &Path, name: &str) -> Result<UnixStream, ConnectError> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
        .open(dir.join(name))
        .map_err(classify)?;
    let kind = file.metadata().map_err(classify)?.file_type();
    if kind.is_symlink() {
        return Err(ConnectError::Other(io::Error::new(
            io::ErrorKind::InvalidData,
            "a symbolic link, not a socket; not followed",
        )));
    }
    if !kind.is_socket() {
        // Nobody can listen on it: as a socket file nobody listens on.
        return Err(ConnectError::Refused);
    }
    let via = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    UnixStream::connect(&via).map_err(classify)
}

/// How a request failed on the client's side.
#[derive(Debug)]
pub enum ClientError {
    /// Writing the request failed (and the server said nothing).
    Write(io::Error),
    /// Reading the answer failed or timed out.
    Read(io::Error),
    /// The server closed the connection without an answer.
    Closed,
    /// The answer is not a response of this protocol.
    Undecodable(String),
}

impl ClientError {
    /// Whether the answer did not come in time.
    pub fn timed_out(&self) -> bool {
        matches!(self, ClientError::Read(e) | ClientError::Write(e)
            if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
    }
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            e if e.timed_out() => f.write_str("no answer in time"),
            ClientError::Write(e) => write!(f, "writing the request: {e}"),
            ClientError::Read(e) => write!(f, "reading the answer: {e}"),
            ClientError::Closed => f.write_str("connection closed without an answer"),
            ClientError::Undecodable(e) => write!(f, "undecodable answer: {e}"),
        }
    }
}

/// One connection to an endpoint.
pub struct Connection {
    reader: BufReader<UnixStream>,
    /// The limit of each answer, from its request to its last byte.
    timeout: Cell<Duration>,
}

impl Connection {
    /// Connects to `dir/name` (not yet greeted), with `timeout` for every
    /// write and for every answer as a whole.
    pub fn open(dir: &Path, name: &str, timeout: Duration) -> Result<Connection, ConnectError> {
        let c = Connection::from_stream(connect(dir, name)?);
        c.set_timeout(timeout);
        Ok(c)
    }

    /// Wraps a connected stream.
    pub fn from_stream(stream: UnixStream) -> Connection {
        Connection {
            reader: BufReader::new(stream),
            timeout: Cell::new(Duration::from_secs(60)),
        }
    }

    /// The limit for each following write, and for each answer line as a
    /// whole (at least 1 ms).
    pub fn set_timeout(&self, timeout: Duration) {
        let t = timeout.max(Duration::from_millis(1));
        self.timeout.set(t);
        let _ = self.reader.get_ref().set_read_timeout(Some(t));
        let _ = self.reader.get_ref().set_write_timeout(Some(t));
    }

    /// The stream, for socket options and raw writes.
    pub fn stream(&mut self) -> &mut UnixStream {
        self.reader.get_mut()
    }

    /// Writes bytes as they are (tests send malformed lines this way).
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.reader.get_mut().write_all(bytes)
    }

    /// Reads one answer line (at most [`MAX_RESPONSE_BYTES`]); empty at end
    /// of file. The whole line must come within the timeout: a server
    /// that sends a byte now and then cannot hold the client past it (a
    /// limit per read would let it, for ever).
    pub fn read_line(&mut self) -> io::Result<Vec<u8>> {
        let deadline = Instant::now() + self.timeout.get();
        let mut line = Vec::new();
        while line.len() < MAX_RESPONSE_BYTES {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            let _ = self.reader.get_ref().set_read_timeout(Some(left));
            let buf = match self.reader.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if buf.is_empty() {
                break;
            }
            let room = MAX_RESPONSE_BYTES - line.len();
            let (n, end) = match buf.iter().take(room).position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (buf.len().min(room), false),
            };
            line.extend_from_slice(&buf[..n]);
            self.reader.consume(n);
            if end {
                break;
            }
        }
        Ok(line)
    }

    /// Sends one line and reads the answer line.
    pub fn exchange(&mut self, line: &[u8]) -> Result<Vec<u8>, ClientError> {
        // A server that refuses us (permission, busy) may have answered and
        // closed already: on a write error, still read what it said.
        let wrote = self.send_raw(line);
        let answer = self.read_line();
        match answer {
            Ok(l) if !l.is_empty() => Ok(l),
            Ok(_) => Err(wrote.err().map_or(ClientError::Closed, ClientError::Write)),
            Err(e) => Err(wrote.err().map_or(ClientError::Read(e), ClientError::Write)),
        }
    }

    /// Sends `req` and decodes the answer.
    pub fn request(&mut self, req: &Request) -> Result<Response, ClientError> {
        let line = self.exchange(&req.to_line())?;
        Response::from_line(&line)
            .map_err(|e| ClientError::Undecodable(format!("{e}: {}", excerpt(&line))))
    }

    /// Sends a raw request line (without its `\n`) and returns the answer as
    /// JSON, for tests that look at fields this build may not know.
    pub fn ask(&mut self, line: &str) -> Result<serde_json::Value, ClientError> {
        let answer = self.exchange(format!("{line}\n").as_bytes())?;
        serde_json::from_slice(&answer)
            .map_err(|e| ClientError::Undecodable(format!("{e}: {}", excerpt(&answer))))
    }

    /// `hello` with this build's protocol version. A refusal comes back as
    /// the server's error answer.
    pub fn hello(
        &mut self,
        client: Option<String>,
    ) -> Result<Result<HelloReply, Response>, ClientError> {
        let r = self.request(&Request::Hello {
            version: PROTOCOL_VERSION,
            client,
        })?;
        Ok(match r {
            Response::Ok(Reply::Hello(h)) => Ok(h),
            other => Err(other),
        })
    }
}

/// How much of an answer that could not be decoded an error shows.
const EXCERPT_BYTES: usize = 200;

/// The start of an answer that could not be decoded, for an error message:
/// at most [`EXCERPT_BYTES`] (an answer may be up to `MAX_RESPONSE_BYTES`),
/// with its length where it was cut.
fn excerpt(answer: &[u8]) -> String {
    let line = answer.strip_suffix(b"\n").unwrap_or(answer);
    if line.len() <= EXCERPT_BYTES {
        return String::from_utf8_lossy(line).into_owned();
    }
    format!(
        "{}… ({} bytes)",
        String::from_utf8_lossy(&line[..EXCERPT_BYTES]),
        line.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_undecodable_answer_is_shown_by_its_start_and_length() {
        assert_eq!(excerpt(b"{\"ok\":1\n"), "{\"ok\":1");
        let huge = vec![b'A'; 64 << 20];
        let e = excerpt(&huge);
        assert!(e.starts_with(&"A".repeat(EXCERPT_BYTES)), "{e}");
        assert!(e.ends_with(&format!("… ({} bytes)", 64 << 20)), "{e}");
        assert!(e.len() < EXCERPT_BYTES + 30, "{}", e.len());
    }
}
