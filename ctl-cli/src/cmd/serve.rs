//! `memshim-ctl serve --listen ADDR`: `/metrics` over HTTP for Prometheus,
//! node_exporter style. Std-only HTTP/1.0-style server: a thread per
//! connection, at most [`MAX_CONNECTIONS`] at once, `Connection: close`,
//! request head capped at 8 KiB and 5 s in all, one scrape at a time, each
//! bounded by [`Limits`]. When every slot is taken, the connection that has
//! waited longest for its request head, [`HEAD_GRACE`] at least, is closed
//! to make room (silent clients cannot lock scrapes out); with none such,
//! the new one gets 503. Nothing is kept between requests.
//!
//! It takes no actions, except `POST /purge?pid=N` when started with
//! `--enable-purge`, which is refused unless the listen address is loopback
//! and, per request, unless the request carries `X-Memshim-Purge: 1` (a
//! header a cross-site browser form cannot set) and a loopback `Host`
//! (against DNS rebinding).

use crate::output::print::{errln, outln};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::Shutdown;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::exit::{self, Exit, Failure};

use super::metrics::{Limits, collect, render};

/// Options of `memshim-ctl serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port; the address is printed)
    #[arg(long, default_value = "127.0.0.1:9464", value_name = "ADDR:PORT")]
    pub listen: SocketAddr,
    /// Also accept POST /purge?pid=N (loopback listen address only; requests need `X-Memshim-Purge: 1`)
    #[arg(long)]
    pub enable_purge: bool,
    #[command(flatten)]
    pub limits: Limits,
}

const MAX_HEAD: usize = 8 * 1024;
/// The whole request head must arrive within this, and the whole answer
/// must be written within it.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once. Prometheus scrapes one at a time.
pub const MAX_CONNECTIONS: usize = 16;
/// How long a connection waits for its request head before a new one may
/// take its slot: a client that sent its head is read within moments; one
/// that sent nothing for this long holds a slot another needs. At 1 s,
/// 16 silent connections a second, each taking the oldest one's slot,
/// kept every scrape out; at this, it would take over 300 a second.
pub const HEAD_GRACE: Duration = Duration::from_millis(50);

/// A stream whose reads all end by one deadline: a client that sends a
/// byte every few seconds cannot hold a connection past it (a timeout per
/// read would let it).
struct ByDeadline<'a> {
    s: &'a TcpStream,
    until: Instant,
}

impl Read for ByDeadline<'_> {
    /// Fails with `TimedOut` only once the deadline has passed (a socket
    /// timeout may fire a little early).
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let left = self.until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(std::io::ErrorKind::TimedOut.into());
            }
            self.s.set_read_timeout(Some(left))?;
            match (&mut &*self.s).read(buf) {
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                other => return other,
            }
        }
    }
}

/// A parsed request head.
#[derive(Debug, PartialEq, Eq)]
pub struct Head {
    /// `GET`, `POST`, ...
    pub method: String,
    /// Path without the query.
    pub path: String,
    /// The query string, if any.
    pub query: Option<String>,
    /// `Host` header value.
    pub host: Option<String>,
    /// `X-Memshim-Purge` header value.
    pub purge_header: Option<String>,
}

/// Reads one request head (up to the blank line), at most [`MAX_HEAD`] bytes.
pub fn read_head(r: impl Read) -> Result<Head, (u16, &'static str)> {
    let mut r = BufReader::new(r.take(MAX_HEAD as u64));
    let mut line = String::new();
    r.read_line(&mut line)
        .map_err(|_| (400, "unreadable request"))?;
    let mut parts = line.split_whitespace();
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err((400, "malformed request line"));
    };
    if !matches!(version, "HTTP/1.0" | "HTTP/1.1") {
        return Err((505, "HTTP/1.0 and HTTP/1.1 only"));
    }
    // The absolute form (`GET http://host/metrics`, as a proxy sends it):
    // its host is the one that counts (RFC 9112 3.2.2), not a Host line.
    let (authority, target) = match target
        .strip_prefix("http://")
        .or_else(|| target.strip_prefix("https://"))
    {
        Some(rest) => match rest.find(['/', '?']) {
            Some(i) => (Some(rest[..i].to_owned()), &rest[i..]),
            None => (Some(rest.to_owned()), "/"),
        },
        None => (None, target),
    };
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_owned(), Some(q.to_owned())),
        None => (target.to_owned(), None),
    };
    let method = method.to_owned();
    let (mut host, mut purge_header) = (None, None);
    loop {
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) => return Err((431, "request head too large or cut off")),
            Ok(_) if line == "\r\n" || line == "\n" => break,
            Ok(_) => {
                let Some((k, v)) = line.split_once(':') else {
                    return Err((400, "malformed header line"));
                };
                {
                    let v = v.trim().to_owned();
                    if k.eq_ignore_ascii_case("host") {
                        // RFC 9112 3.2: a second Host line is a bad request
                        // (a proxy and this server could read different ones).
                        if host.replace(v).is_some() {
                            return Err((400, "more than one Host header"));
                        }
                    } else if k.eq_ignore_ascii_case("x-memshim-purge") {
                        purge_header = Some(v);
                    }
                }
            }
            Err(_) => return Err((400, "unreadable request")),
        }
    }
    if authority.is_some() {
        host = authority;
    }
    Ok(Head {
        method,
        path,
        query,
        host,
        purge_header,
    })
}

fn respond(s: &TcpStream, code: u16, ctype: &str, body: &str, head_only: bool) {
    respond_with(s, code, "", ctype, body, head_only);
}

/// [`respond`] with `headers` (each line ending in `\r\n`) added.
fn respond_with(s: &TcpStream, code: u16, headers: &str, ctype: &str, body: &str, head_only: bool) {
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        505 => "HTTP Version Not Supported",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let mut answer = format!(
        "HTTP/1.1 {code} {reason}\r\n{headers}Content-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if !head_only {
        answer += body;
    }
    send(s, answer.as_bytes());
}

/// Writes a whole answer within [`IO_TIMEOUT`]: a client that reads slowly
/// cannot hold its connection, and one of the [`MAX_CONNECTIONS`], past
/// that (a timeout per write would let it).
fn send(s: &TcpStream, bytes: &[u8]) {
    let until = Instant::now() + IO_TIMEOUT;
    let mut left = bytes;
    while !left.is_empty() {
        let t = until.saturating_duration_since(Instant::now());
        if t.is_zero() || s.set_write_timeout(Some(t)).is_err() {
            return;
        }
        match (&mut &*s).write(left) {
            Ok(0) => return,
            Ok(n) => left = &left[n..],
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(_) => return,
        }
    }
}

/// A `Host` header naming a loopback address (with or without port).
pub fn loopback_host(h: &str) -> bool {
    if let Ok(ip) = h.parse::<std::net::IpAddr>() {
        return ip.is_loopback();
    }
    let name = if let Some(rest) = h.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        h.rsplit_once(':').map_or(h, |(n, _)| n)
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn purge(head: &Head) -> (u16, String) {
    if head.purge_header.as_deref() != Some("1") {
        return (
            403,
            "{\"error\":\"POST /purge needs the header X-Memshim-Purge: 1\"}\n".into(),
        );
    }
    if !head.host.as_deref().is_some_and(loopback_host) {
        return (
            403,
            "{\"error\":\"POST /purge needs a loopback Host header\"}\n".into(),
        );
    }
    // Exactly one pid: a second one would otherwise be ignored without a word.
    let mut pids = head
        .query
        .as_deref()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.strip_prefix("pid="));
    let pid = match (pids.next(), pids.next()) {
        (Some(p), None) => p.parse::<i32>().ok().filter(|p| *p > 0),
        _ => None,
    };
    let Some(pid) = pid else {
        return (
            400,
            "{\"error\":\"POST /purge?pid=N with one positive pid\"}\n".into(),
        );
    };
    let reply = crate::reach::client::Client::open(pid)
        .and_then(|mut c| c.request(&memshim_proto::Request::Purge));
    match reply {
        Ok(r) => (200, serde_json::to_string(&r).unwrap_or_default() + "\n"),
        Err(f) => {
            // The HTTP status says what the exit code would (exit.rs).
            let code = match f.exit {
                exit::NOT_FOUND => 404,
                exit::PERMISSION => 403,
                exit::NO_ENDPOINT => 503,
                _ => 502,
            };
            (
                code,
                serde_json::json!({ "error": f.line() }).to_string() + "\n",
            )
        }
    }
}

/// What the connections share.
struct Server {
    args: ServeArgs,
    /// Connections being served.
    busy: AtomicUsize,
    /// Those still waiting for their request head, oldest first.
    waiting: Mutex<VecDeque<(u64, TcpStream, Instant)>>,
    next_id: AtomicU64,
    /// One scrape at a time: concurrent requests cannot multiply the work
    /// a scrape makes on the host.
    scrape: Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Server {
    /// Takes a slot for the new connection `s`: a free one, or that of the
    /// connection that has waited longest for its head, at least
    /// [`HEAD_GRACE`] (closed here), and registers `s` as waiting for its
    /// head. Its id, or `None` when no slot can be had: every one is
    /// answering a request, or waits for a head that may be on its way (a
    /// burst of clients whose heads their threads have not read yet: they
    /// were closed unanswered, where one more now gets 503).
    fn admit(&self, s: &TcpStream) -> Option<u64> {
        let mut waiting = lock(&self.waiting);
        if self.busy.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            let idle = waiting
                .front()
                .is_some_and(|(_, _, since)| since.elapsed() >= HEAD_GRACE);
            // Taken off the queue only when closed: a connection taken off
            // and left open could never be closed to make room again.
            let Some((_, oldest, _)) = idle.then(|| waiting.pop_front()).flatten() else {
                self.busy.fetch_sub(1, Ordering::AcqRel);
                return None;
            };
            // Its thread sees the end of the stream and gives its slot
            // back; until then one more than the limit runs.
            let _ = oldest.shutdown(Shutdown::Both);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if let Ok(c) = s.try_clone() {
            waiting.push_back((id, c, Instant::now()));
        }
        Some(id)
    }
}

/// A taken slot of connection `.1`, given back when dropped (also when
/// the connection's thread cannot be started).
struct Slot(Arc<Server>, u64);

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.0.waiting).retain(|(i, _, _)| *i != self.1);
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Ends a refused connection without a reset: what the client already
/// sent is read and dropped (a close with unread bytes makes the kernel
/// reset the connection, and the client may then not see the answer).
fn close_gently(s: TcpStream) {
    let _ = s.shutdown(Shutdown::Write);
    if s.set_nonblocking(true).is_ok() {
        let mut sink = [0u8; 4096];
        for _ in 0..16 {
            if !matches!((&s).read(&mut sink), Ok(n) if n > 0) {
                break;
            }
        }
    }
}

/// 405 with the methods that path takes.
fn not_allowed(s: &TcpStream, allow: &str) {
    let headers = format!("Allow: {allow}\r\n");
    respond_with(
        s,
        405,
        &headers,
        "text/plain",
        "method not allowed\n",
        false,
    );
}

/// Serves connection `id`, which [`Server::admit`] registered as waiting
/// for its head.
fn handle(s: TcpStream, id: u64, server: &Server) {
    let a = &server.args;
    let until = Instant::now() + IO_TIMEOUT;
    let head = read_head(ByDeadline { s: &s, until });
    lock(&server.waiting).retain(|(i, _, _)| *i != id);
    let head = match head {
        Ok(h) => h,
        Err(_) if Instant::now() >= until => {
            respond(
                &s,
                408,
                "text/plain",
                "request head not sent within 5 s\n",
                false,
            );
            return close_gently(s);
        }
        Err((code, msg)) => {
            respond(&s, code, "text/plain", &format!("{msg}\n"), false);
            return close_gently(s);
        }
    };
    let get = head.method == "GET" || head.method == "HEAD";
    let head_only = head.method == "HEAD";
    match head.path.as_str() {
        "/metrics" if get => {
            let body = {
                let _one = lock(&server.scrape);
                let (samples, info) = collect(&a.limits);
                render(&samples, &info)
            };
            respond(
                &s,
                200,
                "text/plain; version=0.0.4; charset=utf-8",
                &body,
                head_only,
            )
        }
        "/" if get => respond(
            &s,
            200,
            "text/html; charset=utf-8",
            "<html><head><title>memshim</title></head><body><h1>memshim-ctl serve</h1>\
             <p><a href=\"/metrics\">Metrics</a></p></body></html>\n",
            head_only,
        ),
        "/purge" if head.method == "POST" && a.enable_purge => {
            let (code, body) = purge(&head);
            respond(&s, code, "application/json", &body, false)
        }
        "/metrics" | "/" => not_allowed(&s, "GET, HEAD"),
        "/purge" if a.enable_purge => not_allowed(&s, "POST"),
        _ => respond(&s, 404, "text/plain", "not found: try /metrics\n", false),
    }
}

/// Why these options do not go together, if they do not: a usage error
/// ([`exit::USAGE`], `Cli::parse_checked`), like every other bad combination of
/// options.
pub fn conflict(a: &ServeArgs) -> Option<String> {
    (a.enable_purge && !a.listen.ip().is_loopback()).then(|| {
        format!(
            "--enable-purge is only allowed on a loopback address, not {}; \
             listen on 127.0.0.1 or [::1], or drop --enable-purge",
            a.listen
        )
    })
}

/// Serves until killed.
pub fn run(a: ServeArgs) -> Result<Exit, Failure> {
    let l = TcpListener::bind(a.listen).map_err(|e| {
        Failure::new(
            exit::FAILED,
            None,
            format!("cannot listen on {}: {e}", a.listen),
        )
    })?;
    let addr = l
        .local_addr()
        .map(|x| x.to_string())
        .unwrap_or_else(|_| a.listen.to_string());
    // A banner for a person; a server whose stdout is closed keeps serving.
    let _ = outln!("serving http://{addr}/metrics");
    let server = Arc::new(Server {
        args: a,
        busy: AtomicUsize::new(0),
        waiting: Mutex::new(VecDeque::new()),
        next_id: AtomicU64::new(0),
        scrape: Mutex::new(()),
    });
    for conn in l.incoming() {
        match conn {
            Ok(s) => {
                let Some(id) = server.admit(&s) else {
                    respond(&s, 503, "text/plain", "too many connections\n", false);
                    close_gently(s);
                    continue;
                };
                let slot = Slot(Arc::clone(&server), id);
                // A failed spawn drops the closure, and with it the slot.
                let _ = std::thread::Builder::new()
                    .name("serve-conn".into())
                    .spawn(move || {
                        let slot = slot;
                        handle(s, id, &slot.0);
                    });
            }
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                errln!("memshim-ctl: serve: accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_heads_parse_and_oversized_ones_are_refused() {
        let h = read_head(
            &b"GET /metrics?x=1 HTTP/1.1\r\nHost: 127.0.0.1:9464\r\nX-Memshim-Purge: 1\r\n\r\n"[..],
        )
        .unwrap();
        assert_eq!(h.path, "/metrics");
        assert_eq!(h.query.as_deref(), Some("x=1"));
        assert_eq!(h.host.as_deref(), Some("127.0.0.1:9464"));
        assert_eq!(h.purge_header.as_deref(), Some("1"));
        let big = format!("GET / HTTP/1.1\r\nX-Pad: {}\r\n\r\n", "a".repeat(MAX_HEAD));
        assert_eq!(read_head(big.as_bytes()).unwrap_err().0, 431);
        assert_eq!(read_head(&b"nonsense\r\n\r\n"[..]).unwrap_err().0, 400);
        let two = b"POST /purge HTTP/1.1\r\nHost: evil.example\r\nhost: 127.0.0.1\r\n\r\n";
        assert_eq!(
            read_head(&two[..]).unwrap_err(),
            (400, "more than one Host header")
        );
        // A header line without a colon, another HTTP version.
        let bad = b"GET /metrics HTTP/1.1\r\nHost 127.0.0.1\r\n\r\n";
        assert_eq!(read_head(&bad[..]).unwrap_err().0, 400);
        assert_eq!(
            read_head(&b"GET /metrics HTTP/9.9\r\n\r\n"[..])
                .unwrap_err()
                .0,
            505
        );
        // The absolute form: its authority is the host.
        let abs = b"POST http://127.0.0.1:9464/purge?pid=1 HTTP/1.1\r\nHost: evil.example\r\n\r\n";
        let h = read_head(&abs[..]).unwrap();
        assert_eq!(
            (h.path.as_str(), h.query.as_deref(), h.host.as_deref()),
            ("/purge", Some("pid=1"), Some("127.0.0.1:9464"))
        );
        let h = read_head(&b"GET http://evil.example HTTP/1.1\r\n\r\n"[..]).unwrap();
        assert_eq!(
            (h.path.as_str(), h.host.as_deref()),
            ("/", Some("evil.example"))
        );
    }

    #[test]
    fn only_loopback_hosts_count_as_loopback() {
        for h in [
            "127.0.0.1",
            "127.0.0.1:9464",
            "localhost:1",
            "LocalHost:1",
            "[::1]:9464",
            "::1",
        ] {
            assert!(loopback_host(h), "{h}");
        }
        for h in ["evil.example:9464", "10.0.0.1:9464", "[fe80::1]:1", ""] {
            assert!(!loopback_host(h), "{h}");
        }
    }
}
