//! A minimal protocol client for the reliability tests (docs/protocol.md):
//! bounded waits everywhere, errors as values so callers can report the
//! seed and the last requests.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Field 22 of /proc/<pid>/stat.
pub fn starttime(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s[s.rfind(')')? + 1..]
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// `<dir>/<pid>-<starttime>.sock`.
pub fn socket_path(dir: &Path, pid: i32) -> Option<PathBuf> {
    Some(dir.join(format!("{pid}-{}.sock", starttime(pid)?)))
}

/// One connection, past `hello`.
pub struct Conn {
    r: BufReader<UnixStream>,
}

impl Conn {
    /// Waits (at most 10 s) for `pid`'s socket in `dir`, connects, says hello.
    pub fn to_pid(dir: &Path, pid: i32) -> Result<Conn, String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let p = socket_path(dir, pid).ok_or_else(|| format!("process {pid} is gone"))?;
            match Conn::open(&p) {
                Ok(c) => return Ok(c),
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!("{}: {e}", p.display()));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Connects to `path` and says hello.
    pub fn open(path: &Path) -> Result<Conn, String> {
        let s = UnixStream::connect(path).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        s.set_write_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        let mut c = Conn {
            r: BufReader::new(s),
        };
        let v = c.ask(r#"{"op":"hello","version":1,"client":"reliability"}"#)?;
        if v.get("ok").is_none() {
            return Err(format!("hello refused: {v}"));
        }
        Ok(c)
    }

    /// One request line, one answer (at most 10 s).
    pub fn ask(&mut self, req: &str) -> Result<serde_json::Value, String> {
        self.r
            .get_mut()
            .write_all(format!("{req}\n").as_bytes())
            .map_err(|e| format!("write: {e}"))?;
        let mut l = String::new();
        match self.r.read_line(&mut l) {
            Ok(0) => Err("connection closed without an answer".into()),
            Ok(_) => {
                serde_json::from_str(&l).map_err(|e| format!("answer is not JSON ({e}): {l:?}"))
            }
            Err(e) => Err(format!("no answer within 10 s: {e}")),
        }
    }
}
