//! One client connection: a bounded input buffer, the pending output, the
//! handshake state and a deadline. Protocol: docs/protocol.md.

use super::facts::Ctx;
use super::requests;
use crate::os::fd::Owned;
use crate::os::sock;
use memshim_proto::*;

/// Requests answered per connection per wake-up; more wait for the next
/// wake-up or tick, so one pipelining client cannot hold the thread.
const MAX_REQUESTS_PER_TURN: usize = 16;
/// Bytes read per connection per wake-up.
const READ_CHUNK: usize = 16 * 1024;
/// How long a refused connection is kept so the client can read why.
const DRAIN_MS: u64 = 1000;

/// What to do with a connection after a turn.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Keep it.
    Keep,
    /// Close it now (its last output was sent or is abandoned).
    Close,
}

/// A client connection.
pub struct Conn {
    sock: Owned,
    input: Vec<u8>,
    output: Vec<u8>,
    sent: usize,
    close_after_output: bool,
    eof: bool,
    hello: bool,
    /// Refused: the error line is queued; discard input until the client
    /// closes or the (short) deadline passes, so it can read the line.
    draining: bool,
    /// Monotonic ms after which the connection is closed.
    pub deadline_ms: u64,
    /// Monotonic ms of the accept, for eviction order.
    pub accepted_ms: u64,
    /// The endpoint's wake-up that accepted it (not evicted during it).
    pub accepted_wakeup: u64,
}

impl Conn {
    /// A new connection.
    pub fn new(sock: Owned, now_ms: u64, wakeup: u64) -> Conn {
        Conn {
            sock,
            input: Vec::new(),
            output: Vec::new(),
            sent: 0,
            close_after_output: false,
            eof: false,
            hello: false,
            draining: false,
            deadline_ms: now_ms + IDLE_TIMEOUT_MS,
            accepted_ms: now_ms,
            accepted_wakeup: wakeup,
        }
    }

    /// A connection that is refused with `code`: it gets one error line,
    /// and is closed when the client closes or after one second.
    pub fn refused(sock: Owned, now_ms: u64, wakeup: u64, code: ErrorCode, message: &str) -> Conn {
        let mut c = Conn::new(sock, now_ms, wakeup);
        c.respond(&Response::Error(ErrorReply::new(code, message)), false);
        c.draining = true;
        c.deadline_ms = now_ms + DRAIN_MS;
        c
    }

    /// The descriptor, if it is still ours.
    pub fn fd(&self) -> Option<i32> {
        self.sock.fd()
    }

    /// Gives the connection up without closing its descriptor (the number
    /// is not ours any more).
    pub fn forget(self) {
        self.sock.forget();
    }

    /// The events to poll for: output first, then input.
    pub fn wants(&self) -> i16 {
        // Queued requests ask for POLLOUT too: the socket is writable at
        // once, so the loop comes back for them without waiting a tick.
        if !self.draining && (self.sent < self.output.len() || self.has_backlog()) {
            libc::POLLOUT
        } else {
            libc::POLLIN
        }
    }

    /// Whether this is a refused connection waiting to be closed.
    pub fn is_draining(&self) -> bool {
        self.draining
    }

    /// Whether complete requests are waiting in the buffer.
    pub fn has_backlog(&self) -> bool {
        self.sent >= self.output.len() && self.input.contains(&b'\n')
    }

    /// Queues `r`; `close` closes the connection once it is sent.
    pub fn respond(&mut self, r: &Response, close: bool) {
        if self.sent >= self.output.len() {
            self.output.clear();
            self.sent = 0;
        }
        self.output.extend_from_slice(&r.to_line());
        self.close_after_output |= close;
    }

    /// Sends an error line (best effort, never waits) before a close.
    pub fn send_final(&self, code: ErrorCode, message: &str) {
        if let Some(fd) = self.fd() {
            let _ = sock::send(
                fd,
                &Response::Error(ErrorReply::new(code, message)).to_line(),
            );
        }
    }

    /// Readable or writable (or hung up): do one bounded turn.
    pub fn turn(&mut self, ctx: &Ctx<'_>) -> Next {
        let Some(fd) = self.fd() else {
            return Next::Close;
        };
        if self.flush(fd) == Next::Close {
            return Next::Close;
        }
        if self.draining {
            let mut chunk = [0u8; READ_CHUNK];
            return match sock::recv(fd, &mut chunk) {
                Ok(0) => Next::Close,
                Ok(_) | Err(libc::EAGAIN) | Err(libc::EINTR) => Next::Keep,
                Err(_) => Next::Close,
            };
        }
        // Input is bounded: nothing more is read while a full line's worth
        // is waiting.
        if self.sent >= self.output.len() && !self.eof && self.input.len() < MAX_REQUEST_BYTES {
            let mut chunk = [0u8; READ_CHUNK];
            match sock::recv(fd, &mut chunk) {
                Ok(0) => self.eof = true,
                Ok(n) => self.input.extend_from_slice(&chunk[..n]),
                Err(libc::EAGAIN) | Err(libc::EINTR) => {}
                Err(_) => return Next::Close,
            }
        }
        self.serve(ctx);
        if self.flush(fd) == Next::Close {
            return Next::Close;
        }
        let idle = self.sent >= self.output.len() && !self.input.contains(&b'\n');
        if self.eof && idle {
            Next::Close
        } else {
            Next::Keep
        }
    }

    /// Answers up to `MAX_REQUESTS_PER_TURN` complete lines. The deadline
    /// runs from the end of each answer, not from the start of the turn: a
    /// request may take seconds (`gc` waits up to 5 s for the GIL).
    pub fn serve(&mut self, ctx: &Ctx<'_>) {
        for _ in 0..MAX_REQUESTS_PER_TURN {
            if self.close_after_output {
                return;
            }
            let Some(nl) = self.input.iter().position(|&b| b == b'\n') else {
                if self.input.len() >= MAX_REQUEST_BYTES {
                    self.input = Vec::new();
                    self.too_large();
                }
                return;
            };
            let line: Vec<u8> = self.input.drain(..=nl).collect();
            if line.len() > MAX_REQUEST_BYTES {
                return self.too_large();
            }
            if line.iter().all(|b| b.is_ascii_whitespace()) {
                continue;
            }
            let response = self.answer(&line, ctx);
            self.respond(&response, false);
            self.deadline_ms = crate::os::time::monotonic_ms() + IDLE_TIMEOUT_MS;
        }
    }

    /// The answer to a line over the limit; the connection is closed after it.
    fn too_large(&mut self) {
        let msg =
            format!("request line longer than {MAX_REQUEST_BYTES} bytes; closing the connection");
        self.respond(
            &Response::Error(ErrorReply::new(ErrorCode::TooLarge, msg)),
            true,
        );
    }

    fn answer(&mut self, line: &[u8], ctx: &Ctx<'_>) -> Response {
        let req = match parse_request(line) {
            Ok(r) => r,
            Err(e) => return Response::Error(e),
        };
        match req {
            Request::Hello { version, .. } => match requests::hello::handle(version, ctx) {
                Ok(h) => {
                    self.hello = true;
                    Response::Ok(Reply::Hello(h))
                }
                Err(e) => Response::Error(e),
            },
            _ if !self.hello => Response::Error(ErrorReply::new(
                ErrorCode::HelloRequired,
                format!("send {{\"op\":\"hello\",\"version\":{PROTOCOL_VERSION}}} first"),
            )),
            ref other => requests::dispatch(other, ctx),
        }
    }

    /// Writes pending output without waiting.
    fn flush(&mut self, fd: i32) -> Next {
        while self.sent < self.output.len() {
            match sock::send(fd, &self.output[self.sent..]) {
                Ok(n) => self.sent += n,
                Err(libc::EAGAIN) | Err(libc::EINTR) => return Next::Keep,
                Err(_) => return Next::Close,
            }
        }
        if self.close_after_output {
            Next::Close
        } else {
            Next::Keep
        }
    }
}
