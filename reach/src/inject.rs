//! Calling functions in a running process: choose a thread at a safe point
//! (blocked in a system call of a known idle kind), save every register,
//! call, restore the registers and the interrupted system call exactly,
//! detach. docs/design.md, "Reaching a process started without the
//! preload", says why each step is as it is.

pub use crate::failure::Failure;
use crate::ptrace::{self, Regs};
use std::fs;
use std::io;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

/// The system calls a thread may be interrupted in and used, with their
/// names, best first: waits that the kernel restarts by itself once the
/// thread goes on (`-ERESTART*`), then `epoll_wait`, which answers `EINTR`
/// to its caller (as under any debugger; CPython retries it, PEP 475).
/// Never a futex wait: it may be CPython's own wait for the GIL (a
/// condition variable's), where `PyGILState_Ensure` would nest a second
/// wait on the same condition inside the first, and glibc's condition
/// variable then loses a wake-up: seen as a hang of a worker of CPython's
/// `test_asyncio` under `release` every second (docs/design.md).
pub const IDLE: [(u64, &str); 16] = [
    (35, "nanosleep"),
    (230, "clock_nanosleep"),
    (23, "select"),
    (270, "pselect6"),
    (7, "poll"),
    (271, "ppoll"),
    (0, "read"),
    (43, "accept"),
    (288, "accept4"),
    (61, "wait4"),
    (247, "waitid"),
    (45, "recvfrom"),
    (47, "recvmsg"),
    (232, "epoll_wait"),
    (281, "epoll_pwait"),
    (441, "epoll_pwait2"),
];

/// Names of the waits that are not safe points, for the message that says
/// what each thread was doing.
const NOT_SAFE: [(u64, &str); 4] = [
    (202, "futex (a lock or the GIL: not a safe point)"),
    (34, "pause (a signal wait: not a safe point)"),
    (128, "rt_sigtimedwait (a signal wait: not a safe point)"),
    (130, "rt_sigsuspend (a signal wait: not a safe point)"),
];

const ERESTARTSYS: i64 = -512;
const ERESTARTNOINTR: i64 = -513;
const ERESTARTNOHAND: i64 = -514;
const ERESTART_RESTARTBLOCK: i64 = -516;
const EINTR: i64 = -4;
const PTRACE_EVENT_STOP: i32 = 128;

/// The thread we hold stopped, and what it was doing.
pub struct Held {
    pid: i32,
    /// The thread's id.
    pub tid: i32,
    /// The system call it was interrupted in.
    pub syscall: &'static str,
    saved: Regs,
    xstate: Vec<u8>,
    /// Signals that arrived for the thread while we held it, given back
    /// when it is let go.
    pending: Vec<i32>,
    mem: fs::File,
    /// The lowest address of our scratch area on the thread's stack.
    scratch: u64,
    done: bool,
    /// When the thread stopped.
    since: Instant,
    /// The process's program as it was when the thread was held
    /// ([`image`]): another thread's `execve` changes it.
    image: Option<(u64, u64)>,
}

/// Where the process's code and stack start (`/proc/PID/stat`'s
/// `startcode` and `startstack`): a new program (`execve`) maps both
/// anew, at other addresses.
fn image(pid: i32) -> Option<(u64, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let f: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // Fields 26 and 28 of stat(5), counted from the state (field 3).
    Some((f.get(23)?.parse().ok()?, f.get(25)?.parse().ok()?))
}

/// The thread's current system call number, from `/proc/PID/task/TID/syscall`
/// (`None`: running, or not readable).
fn syscall_of(pid: i32, tid: i32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// The thread ids of `pid`.
pub fn tasks(pid: i32) -> io::Result<Vec<i32>> {
    let mut out: Vec<i32> = fs::read_dir(format!("/proc/{pid}/task"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    out.sort_unstable();
    Ok(out)
}

fn rank(nr: u64) -> Option<usize> {
    IDLE.iter().position(|&(n, _)| n == nr)
}

/// `restart_syscall`: what the kernel resumes a sleep, a `poll` or a futex
/// wait with a timeout as, once a stop (ours, a debugger's, SIGSTOP and
/// SIGCONT) interrupted it. Which of them it resumes shows only in where
/// the thread sleeps in the kernel (`/proc/PID/task/TID/wchan`).
const RESTART_SYSCALL: u64 = 219;

/// The idle call a `restart_syscall` resumes, as its row of [`IDLE`]: a
/// sleep or a `poll` (whose wait functions `wchan` names), never a futex
/// wait (`futex_do_wait`, `futex_wait_queue`: it may be the GIL's) or what
/// cannot be read. `wchan` skips the scheduler's functions, and a
/// relative sleep's restart (`hrtimer_nanosleep_restart`, `do_nanosleep`)
/// is made of them only: newer kernels name the system call's entry
/// (`do_syscall_64`) for it, which no futex or poll restart shows.
fn restarted(pid: i32, tid: i32) -> Option<usize> {
    let wchan = fs::read_to_string(format!("/proc/{pid}/task/{tid}/wchan")).ok()?;
    rank(resumed_call(&wchan)?)
}

/// The system call a `restart_syscall` waiting in `wchan` resumes, where
/// it is a safe point: `poll` (7) or `nanosleep` (35).
fn resumed_call(wchan: &str) -> Option<u64> {
    if wchan.starts_with("poll_schedule_timeout") || wchan.starts_with("do_sys_poll") {
        Some(7)
    } else if wchan.contains("nanosleep") || wchan.contains("nsleep") || wchan == "do_syscall_64" {
        Some(35)
    } else {
        None
    }
}

/// The row of [`IDLE`] for what thread `tid` waits in now, if it is a safe
/// point: with [`STACK_ROOM`] of stack below it.
fn idle_rank(pid: i32, tid: i32) -> Option<usize> {
    let r = match syscall_of(pid, tid)? {
        RESTART_SYSCALL => restarted(pid, tid),
        nr => rank(nr),
    }?;
    (stack_room(pid, tid)? >= STACK_ROOM).then_some(r)
}

/// The stack a held thread must have free below its stack pointer for the
/// calls made on it: `dlopen` of the bridge, CPython's C API and the
/// verbs' Python steps. A thread with less (a small stack of its own:
/// `pthread_attr_setstacksize`, `threading.stack_size`) is not used: the
/// call would overflow it, and a fault inside `dlopen` leaves the loader's
/// lock held, and the process's next `dlopen` or `dlsym` waits for ever.
/// Measured: `attach` faulted on threads of 16 and 20 KiB and loaded on
/// one of 24 KiB.
const STACK_ROOM: u64 = 32 << 10;

/// Bytes of stack below thread `tid`'s stack pointer (read, with the
/// pointer, without stopping it): to the start of its mapping, or, for the
/// main thread's stack (`[stack]`, which the kernel grows), unbounded.
fn stack_room(pid: i32, tid: i32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
    // "NR arg1 ... arg6 SP PC" while in a system call.
    let f: Vec<&str> = s.split_whitespace().collect();
    let sp = u64::from_str_radix(f.get(7)?.trim_start_matches("0x"), 16).ok()?;
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    maps.lines().find_map(|l| {
        let (range, rest) = l.split_once(' ')?;
        let (a, b) = range.split_once('-')?;
        let (a, b) = (
            u64::from_str_radix(a, 16).ok()?,
            u64::from_str_radix(b, 16).ok()?,
        );
        (a..b).contains(&sp).then(|| {
            if rest.trim_end().ends_with("[stack]") {
                u64::MAX
            } else {
                sp - a
            }
        })
    })
}

/// Whether `pid` has exited: gone, or a zombie its parent has not reaped.
fn exited(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
        s.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with(['Z', 'X']))
    })
}

/// What each thread is doing, for the no-safe-point message.
fn describe(pid: i32) -> String {
    let parts: Vec<String> = tasks(pid)
        .unwrap_or_default()
        .into_iter()
        .map(|t| {
            let what = match syscall_of(pid, t) {
                Some(RESTART_SYSCALL) => match restarted(pid, t) {
                    Some(r) => format!("restart_syscall ({})", IDLE[r].1),
                    None => {
                        "restart_syscall (of a futex wait, or unknown: not a safe point)".into()
                    }
                },
                Some(nr) => IDLE
                    .iter()
                    .chain(NOT_SAFE.iter())
                    .find(|&&(n, _)| n == nr)
                    .map_or(format!("system call {nr}"), |&(_, name)| name.to_string()),
                None => "running".to_string(),
            };
            match stack_room(pid, t) {
                Some(room) if room < STACK_ROOM && syscall_of(pid, t).is_some() => format!(
                    "thread {t}: {what}, with {} KiB of stack below it (too little for memshim's calls)",
                    room >> 10
                ),
                _ => format!("thread {t}: {what}"),
            }
        })
        .collect();
    parts.join(", ")
}

/// Stops one thread of `pid` at a safe point, trying threads in the order
/// of [`IDLE`] (and, among equals, `prefer` first), until `limit` has
/// passed. Nothing of the process is changed until a thread is held. A
/// thread another tracer holds (`EPERM`: the permission checks came
/// first) is tried again until then, and is the answer at the limit.
pub fn hold(pid: i32, limit: Duration, prefer: impl Fn(i32) -> bool) -> Result<Held, Failure> {
    let start = Instant::now();
    let mut refused = None;
    loop {
        let mut candidates: Vec<(usize, bool, i32)> = tasks(pid)
            .map_err(|_| Failure::Gone)?
            .into_iter()
            .filter_map(|t| Some((idle_rank(pid, t)?, !prefer(t), t)))
            .collect();
        candidates.sort_unstable();
        for (rank, _, tid) in candidates {
            match try_hold(pid, tid, IDLE[rank].1) {
                Ok(Some(h)) => return Ok(h),
                Ok(None) => {}
                // Another tracer holds this thread: a second memshim-ctl
                // lets go within moments, strace never (then, at the
                // limit, the refusal).
                Err(Failure::Seize(e)) if e.raw_os_error() == Some(libc::EPERM) => {
                    refused = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        // Nothing is held or changed yet: Ctrl-C (which the caller holds
        // while it changes the process) need not wait for the limit.
        if ptrace::search_ends_on_signal()
            && let Some(sig) = ptrace::ending_signal_pending()
        {
            return Err(Failure::Interrupted(sig));
        }
        if start.elapsed() >= limit {
            return Err(match refused {
                Some(e) => Failure::Seize(e),
                // Its threads stopped waiting because it exited.
                None if exited(pid) => Failure::Gone,
                None => Failure::NoSafePoint(describe(pid)),
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Seizes and interrupts `tid`; keeps it if it stopped in an idle system
/// call, lets it go unchanged otherwise. `seen` is the call it was seen
/// in: what a `restart_syscall` resumes ([`restarted`]).
fn try_hold(pid: i32, tid: i32, seen: &'static str) -> Result<Option<Held>, Failure> {
    match ptrace::seize(tid) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(None),
        Err(e) => return Err(Failure::Seize(e)),
    }
    ptrace::interrupt(tid)?;
    let mut pending = Vec::new();
    // Until the interrupt's stop: a signal that arrives first stops the
    // thread too; it is kept and given back.
    loop {
        let Some(status) = ptrace::wait(tid, false)? else {
            continue;
        };
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            return Err(Failure::Gone);
        }
        if status >> 16 == PTRACE_EVENT_STOP {
            break;
        }
        pending.push(libc::WSTOPSIG(status));
        ptrace::cont(tid, 0)?;
    }
    let mut regs = ptrace::get_regs(tid)?;
    let nr = regs.orig_rax as i64;
    // A socket wait with a receive timeout (`SO_RCVTIMEO`: `read`, `recv*`,
    // `accept`) answers EINTR to any stop where one without restarts: our
    // interrupt alone, no signal, would end the program's call with EINTR,
    // held or not. It is made the restart the kernel makes of the others
    // (`-ERESTARTSYS`): the call waits again, its whole timeout, once the
    // thread goes on. Not with a signal pending, whose EINTR it is, nor for
    // epoll, which takes its caller's timeout again (below).
    if regs.rax as i64 == EINTR && pending.is_empty() && matches!(nr, 0 | 43 | 288 | 45 | 47) {
        regs.rax = ERESTARTSYS as u64;
        ptrace::set_regs(tid, &regs)?;
    }
    let ret = regs.rax as i64;
    let restart = matches!(
        ret,
        ERESTARTSYS | ERESTARTNOINTR | ERESTARTNOHAND | ERESTART_RESTARTBLOCK
    );
    let epoll = matches!(nr, 232 | 281 | 441) && ret == EINTR;
    let name = if nr == RESTART_SYSCALL as i64 && ret == ERESTART_RESTARTBLOCK {
        // Resumed again just as it was: by the same restart.
        Some(seen)
    } else {
        IDLE.iter().find(|&&(n, _)| n as i64 == nr).map(|&(_, s)| s)
    };
    let (Some(name), true) = (name, restart || epoll) else {
        // Not in an idle call after all (it returned meanwhile): the
        // registers are untouched, the kernel restarts what it interrupted.
        release(pid, tid, &pending)?;
        return Ok(None);
    };
    let xstate = ptrace::get_xstate(tid)?;
    let mem = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/mem"))?;
    // Below the red zone (128 bytes of the System V ABI) and 16-aligned.
    let scratch = (regs.rsp - 128 - 4096) & !0xf;
    Ok(Some(Held {
        pid,
        tid,
        syscall: name,
        saved: regs,
        xstate,
        pending,
        mem,
        scratch,
        done: false,
        since: Instant::now(),
        image: image(pid),
    }))
}

/// Lets a thread go with the signals it received while held.
fn release(pid: i32, tid: i32, pending: &[i32]) -> io::Result<()> {
    let first = pending.first().copied().unwrap_or(0);
    ptrace::detach(tid, first)?;
    for &s in pending.iter().skip(1) {
        ptrace::tgkill(pid, tid, s);
    }
    Ok(())
}

impl Held {
    /// Copies `bytes` into the scratch area (4 KiB below the thread's
    /// stack pointer) at `offset`, and returns its address in the target.
    pub fn put(&mut self, offset: u64, bytes: &[u8]) -> io::Result<u64> {
        if offset + bytes.len() as u64 > 4096 - 64 {
            return Err(io::Error::other("scratch area too small"));
        }
        let at = self.scratch + offset;
        self.mem.write_all_at(bytes, at)?;
        Ok(at)
    }

    /// The 8 bytes at `addr`, as the target's `u64`.
    pub fn read_u64(&self, addr: u64) -> io::Result<u64> {
        let mut b = [0u8; 8];
        self.mem.read_exact_at(&mut b, addr)?;
        Ok(u64::from_ne_bytes(b))
    }

    /// Reads a NUL-terminated string of at most `max` bytes at `addr`.
    pub fn read_cstr(&self, addr: u64, max: usize) -> io::Result<String> {
        let mut buf = vec![0u8; max];
        let n = self.mem.read_at(&mut buf, addr)?;
        buf.truncate(n);
        let end = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
    }

    /// Calls `func(args...)` (at most 6 integer arguments) on the held
    /// thread, on its own stack below the scratch area, and returns `rax`.
    /// The call returns to address 0; the fault there is our sign that it
    /// returned, and is never delivered.
    pub fn call(&mut self, func: u64, args: &[u64]) -> Result<u64, Failure> {
        let mut r = self.saved;
        let a = |i: usize| args.get(i).copied().unwrap_or(0);
        r.rdi = a(0);
        r.rsi = a(1);
        r.rdx = a(2);
        r.rcx = a(3);
        r.r8 = a(4);
        r.r9 = a(5);
        r.rax = 0;
        r.rip = func;
        // No system call to restart once the thread goes on: the kernel
        // must not rewind our `rip`.
        r.orig_rax = u64::MAX;
        // At a function's entry `rsp + 8` is 16-aligned; the return
        // address (0) is at `rsp`.
        r.rsp = self.scratch - 64 - 8;
        self.mem.write_all_at(&0u64.to_le_bytes(), r.rsp)?;
        ptrace::set_regs(self.tid, &r)?;
        ptrace::cont(self.tid, 0)?;
        loop {
            let status = match self.wait_stop() {
                Ok(s) => s,
                Err(e) => {
                    self.done = true;
                    return Err(e);
                }
            };
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                self.done = true;
                return Err(if self.execed() {
                    Failure::Exec
                } else {
                    Failure::Gone
                });
            }
            let sig = libc::WSTOPSIG(status);
            if status >> 16 != 0 {
                // An event stop (a group stop of the process): go on.
                ptrace::cont(self.tid, 0)?;
                continue;
            }
            if sig == libc::SIGSEGV {
                let now = ptrace::get_regs(self.tid)?;
                if now.rip == 0 {
                    return Ok(now.rax);
                }
                if self.execed() || ptrace::fault_address(self.tid).ok() == Some(func) {
                    // Our function is not mapped where the thread runs:
                    // the process runs a new program (another thread's
                    // `execve`).
                    // Its registers are put back as for any call: the
                    // kernel then starts the new program as without us
                    // (letting it go as it is faulted it again).
                    self.done = true;
                    let _ = self.restore();
                    return Err(Failure::Exec);
                }
                return Err(Failure::Io(format!(
                    "the called function faulted at {:#x}",
                    now.rip
                )));
            }
            // A signal for the thread: kept, given back when we let go.
            self.pending.push(sig);
            ptrace::cont(self.tid, 0)?;
        }
    }

    /// Whether the process runs another program than when the thread
    /// was held (another thread's `execve`).
    fn execed(&self) -> bool {
        image(self.pid).is_some_and(|now| Some(now) != self.image)
    }

    /// The thread's next stop. Waits without blocking, looking meanwhile
    /// whether the process ran `execve`: that replaces the held thread,
    /// and a blocking wait could then go on for ever.
    fn wait_stop(&self) -> Result<i32, Failure> {
        loop {
            match ptrace::wait(self.tid, true) {
                Ok(Some(status)) => return Ok(status),
                Ok(None) => {}
                Err(_) if self.execed() => return Err(Failure::Exec),
                Err(e) => return Err(e.into()),
            }
            if self.execed() {
                return Err(Failure::Exec);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Puts every register back, with the interrupted system call as the
    /// kernel left it (so it restarts, or answers EINTR, as it would have
    /// without us), and lets the thread go.
    pub fn finish(mut self) -> Result<(), Failure> {
        self.done = true;
        self.restore()
    }

    fn restore(&mut self) -> Result<(), Failure> {
        self.keep_deadline()?;
        ptrace::set_xstate(self.tid, &self.xstate)?;
        ptrace::set_regs(self.tid, &self.saved)?;
        release(self.pid, self.tid, &self.pending)?;
        Ok(())
    }
}

impl Held {
    /// `select`, `pselect6` and `ppoll` restart with the time that was
    /// left when the thread stopped, which the kernel wrote back to the
    /// caller's timeout; the time we held the thread is taken off it, so
    /// that the wait ends when it would have ended without us. (`nanosleep`,
    /// `clock_nanosleep` and `poll` restart towards their original end
    /// time by themselves.)
    fn keep_deadline(&mut self) -> io::Result<()> {
        let r = &self.saved;
        let (ptr, per_sec) = match r.orig_rax {
            23 => (r.r8, 1_000_000u64),       // struct timeval *
            270 => (r.r8, 1_000_000_000u64),  // struct timespec *
            271 => (r.rdx, 1_000_000_000u64), // struct timespec *
            _ => return Ok(()),
        };
        if ptr == 0 || r.rax as i64 != ERESTARTNOHAND {
            return Ok(());
        }
        let mut b = [0u8; 16];
        self.mem.read_exact_at(&mut b, ptr)?;
        let sec = i64::from_le_bytes(b[..8].try_into().unwrap_or_default());
        let frac = i64::from_le_bytes(b[8..].try_into().unwrap_or_default());
        let unit = 1_000_000_000 / per_sec as i128; // ns per unit
        let left = sec as i128 * 1_000_000_000 + frac as i128 * unit;
        let left = (left - self.since.elapsed().as_nanos() as i128).max(0);
        let sec = (left / 1_000_000_000) as i64;
        let frac = ((left % 1_000_000_000) / unit) as i64;
        b[..8].copy_from_slice(&sec.to_le_bytes());
        b[8..].copy_from_slice(&frac.to_le_bytes());
        self.mem.write_all_at(&b, ptr)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.restore();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::resumed_call;

    /// What `wchan` shows for a resumed wait, across kernels: a sleep (its
    /// restart's own name, or only the system call's entry where every
    /// function below it is the scheduler's) and a `poll` are safe points,
    /// a futex wait never.
    #[test]
    fn only_a_resumed_sleep_or_poll_is_a_safe_point() {
        for w in [
            "hrtimer_nanosleep_restart",
            "do_nanosleep",
            "posix_cpu_nsleep_restart",
            "alarm_timer_nsleep_restart",
            "do_syscall_64",
        ] {
            assert_eq!(resumed_call(w), Some(35), "{w}");
        }
        for w in ["poll_schedule_timeout.constprop.0", "do_sys_poll"] {
            assert_eq!(resumed_call(w), Some(7), "{w}");
        }
        for w in ["futex_do_wait", "futex_wait_queue", "0", ""] {
            assert_eq!(resumed_call(w), None, "{w}");
        }
    }
}
