//! CPython 3.14+'s remote debugging (PEP 768), written here: no Python on
//! our side, no ptrace stop. The target runs a script file the next time
//! the chosen thread checks its eval breaker, which it does while it runs
//! bytecode: the road for a process that never waits in the kernel (a
//! pure-Python loop), where no thread reaches a safe point
//! ([`crate::inject`]).
//!
//! What `sys.remote_exec` does, from the interpreter's `_Py_DebugOffsets`
//! (the start of `_PyRuntime`, found in the dynamic symbols):
//! * the main interpreter (`interpreters.head`), and in it whether remote
//!   debugging is on (`config.remote_debug`: off under
//!   `PYTHON_DISABLE_REMOTE_DEBUG`, `-X disable_remote_debug`, or an
//!   embedder's config): refused when off;
//! * the thread that last held the GIL (`_gil.last_holder`; the main
//!   thread's state if none), the one running bytecode;
//! * into its `remote_debugger_support`: the script's path, then
//!   `debugger_pending_call = 1`, then the eval breaker's
//!   `_PY_EVAL_PLEASE_STOP_BIT`.
//!
//! Memory is read and written through `/proc/PID/mem` (allowed where
//! ptrace would be: the checks of [`crate::check`] run first). The eval
//! breaker is read, or-ed and written back, as CPython's own client does:
//! a bit the target sets in between is lost, and CPython sets it again at
//! its next check.

use crate::check::{Refusal, Refused};
use crate::{Error, Failure, examine};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;

/// `_Py_Debug_Cookie`.
const COOKIE: &[u8; 8] = b"xdebugpy";
/// `_PY_EVAL_PLEASE_STOP_BIT` (Include/internal/pycore_ceval.h, 3.14+).
const PLEASE_STOP: u64 = 1 << 5;
/// `MAX_SCRIPT_PATH_SIZE`: the buffer for the path, NUL included.
const PATH_SIZE: u64 = 512;

/// A script handed to the target, not yet taken (or taken: [`taken`]).
///
/// [`taken`]: Pending::taken
pub struct Pending {
    mem: File,
    /// `&tstate->remote_debugger_support.debugger_pending_call`.
    flag: u64,
    /// The address of the thread state that holds it.
    pub thread_state: u64,
}

fn io(what: &str, e: std::io::Error) -> Error {
    if e.raw_os_error() == Some(libc::ESRCH) {
        return Error::Failed(Failure::Gone);
    }
    Error::Failed(Failure::Io(format!("{what}: {e}")))
}

fn word(mem: &File, at: u64) -> Result<u64, Error> {
    let mut b = [0u8; 8];
    mem.read_exact_at(&mut b, at)
        .map_err(|e| io("reading the process's memory", e))?;
    Ok(u64::from_le_bytes(b))
}

fn int(mem: &File, at: u64) -> Result<i32, Error> {
    let mut b = [0u8; 4];
    mem.read_exact_at(&mut b, at)
        .map_err(|e| io("reading the process's memory", e))?;
    Ok(i32::from_le_bytes(b))
}

fn put(mem: &File, at: u64, b: &[u8]) -> Result<(), Error> {
    mem.write_all_at(b, at)
        .map_err(|e| io("writing the process's memory", e))
}

/// The offsets this road reads, from the interpreter's `_Py_DebugOffsets`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Offsets {
    interpreters_head: u64,
    threads_main: u64,
    gil_holder: u64,
    eval_breaker: u64,
    support: u64,
    enabled: u64,
    pending: u64,
    path: u64,
}

/// Reads `Offsets` from the words after the cookie (`a[0]` is the
/// version): the runtime's and the interpreter's sections are laid out
/// alike on 3.14 and 3.15 (`size, finalizing, interpreters_head`; then
/// `size, id, next, threads_head, threads_main, gc, imports_modules,
/// sysdict, builtins, ceval_gil, gil_runtime_state, .._enabled,
/// .._locked, .._holder, ...`), and the debugger's section is found by its
/// tail (`debugger_pending_call` 0, `debugger_script_path` 4, its size
/// 512).
fn offsets(a: &[u64]) -> Option<Offsets> {
    // Sanity of the fixed part: `ceval_gil` is the interpreter's second
    // field, and the free-threaded build (a[1]) is not served.
    if a.len() < 24 || a[1] != 0 || a[14] != 16 {
        return None;
    }
    let d = a
        .windows(6)
        .position(|w| w[3] == 0 && w[4] == 4 && w[5] == PATH_SIZE)?;
    let w = &a[d..d + 6];
    Some(Offsets {
        interpreters_head: a[4],
        threads_main: a[9],
        gil_holder: a[18],
        eval_breaker: w[0],
        support: w[1],
        enabled: w[2],
        pending: w[3],
        path: w[4],
    })
}

/// Hands the script at `script` (a path the target can open, at most 511
/// bytes) to CPython 3.14+ process `pid`, after the same refusals as the
/// other roads and CPython's own (remote debugging off). Nothing is
/// written if anything is refused or unreadable.
pub fn remote_exec(pid: i32, script: &str) -> Result<Pending, Error> {
    let (py, mut syms) = examine(pid)?;
    if py.version < (3, 14) {
        return Err(Error::Failed(Failure::Io(format!(
            "remote debugging (PEP 768) needs CPython 3.14 or newer; this is {}.{}",
            py.version.0, py.version.1
        ))));
    }
    if script.len() as u64 >= PATH_SIZE || script.as_bytes().contains(&0) {
        return Err(Error::Failed(Failure::Io(format!(
            "the script's path is longer than CPython's {} bytes",
            PATH_SIZE - 1
        ))));
    }
    let runtime = syms
        .find("_PyRuntime")
        .map(|(a, _)| a)
        .ok_or_else(|| Error::Failed(Failure::Io("no _PyRuntime in the process's files".into())))?;
    let mem = OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .map_err(|e| io("opening the process's memory", e))?;
    let mut head = [0u8; 8 + 8 * 160];
    mem.read_exact_at(&mut head, runtime)
        .map_err(|e| io("reading _Py_DebugOffsets", e))?;
    let a: Vec<u64> = head[8..]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect();
    let version = (a[0] >> 24, (a[0] >> 16) & 0xff);
    let o = (&head[..8] == COOKIE && version == (3, u64::from(py.version.1)))
        .then(|| offsets(&a))
        .flatten()
        .ok_or_else(|| {
            Error::Failed(Failure::Io(
                "the interpreter's _Py_DebugOffsets are not those of a CPython memshim-ctl knows"
                    .into(),
            ))
        })?;
    let interp = word(&mem, runtime + o.interpreters_head)?;
    if interp == 0 {
        return Err(Error::Failed(Failure::NotInitialised));
    }
    if int(&mem, interp + o.enabled)? == 0 {
        return Err(Error::Refused(Refused {
            kind: Refusal::RemoteDebugDisabled,
            message: format!(
                "process {pid} has CPython's remote debugging off (its configuration, \
                 PYTHON_DISABLE_REMOTE_DEBUG or -X disable_remote_debug): memshim-ctl \
                 respects that and does not reach it"
            ),
        }));
    }
    let tstate = match word(&mem, interp + o.gil_holder)? {
        0 => word(&mem, interp + o.threads_main)?,
        t => t,
    };
    if tstate == 0 {
        return Err(Error::Failed(Failure::Io(
            "the interpreter has no thread".into(),
        )));
    }
    let support = tstate + o.support;
    let flag = support + o.pending;
    if int(&mem, flag)? != 0 {
        return Err(Error::Failed(Failure::Io(
            "another remote debugger's script is pending in the process; try again".into(),
        )));
    }
    let mut path = script.as_bytes().to_vec();
    path.push(0);
    put(&mem, support + o.path, &path)?;
    put(&mem, flag, &1i32.to_le_bytes())?;
    let breaker = word(&mem, tstate + o.eval_breaker)?;
    put(
        &mem,
        tstate + o.eval_breaker,
        &(breaker | PLEASE_STOP).to_le_bytes(),
    )?;
    Ok(Pending {
        mem,
        flag,
        thread_state: tstate,
    })
}

impl Pending {
    /// Whether the target has taken the script (its flag back to 0: it is
    /// cleared just before the script runs).
    pub fn taken(&self) -> Result<bool, Error> {
        Ok(int(&self.mem, self.flag)? == 0)
    }

    /// Takes the script back if it was not taken: the flag cleared. A
    /// thread that checks it at the same moment may still run it.
    pub fn withdraw(&self) -> Result<bool, Error> {
        if self.taken()? {
            return Ok(false);
        }
        put(&self.mem, self.flag, &0i32.to_le_bytes())?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The words of Debian's 3.14.10 and 3.15.2 (read from their
    /// `_PyRuntime`, 2026-12-05): the same offsets found in both layouts.
    #[test]
    fn the_debug_offsets_of_314_and_315_are_read() {
        let v314: &[u64] = &[
            51251952, 0, 316616, 784, 808, 225864, 7280, 7272, 7344, 7360, 7408, 7688, 7672, 7680,
            16, 7784, 0, 7800, 7792, 7992, 0, 832, 0, 8, 16, 72, 152, 160, 232, 32, 88, 8, 0, 56,
            80, 74, 64, 0, 216, 112, 120, 128, 136, 68, 52, 96, 104, 208, 0, 16, 8, 416, 24, 88,
            168, 40, 32, 16, 40, 24, 16, 200, 24, 40, 32, 48, 32, 40, 24, 16, 32, 16, 24, 40, 16,
            32, 64, 32, 16, 40, 264, 192, 160, 24, 72, 67, 0, 8, 24, 304, 8076, 0, 4, 512, 1,
        ];
        let o = offsets(v314).unwrap();
        assert_eq!(
            (o.interpreters_head, o.threads_main, o.gil_holder),
            (808, 7360, 7792)
        );
        assert_eq!(
            (o.eval_breaker, o.support, o.enabled, o.pending, o.path),
            (24, 304, 8076, 0, 4)
        );
        let mut v315 = v314.to_vec();
        let at = v315.iter().rposition(|&w| w == 304).unwrap();
        v315[at] = 344;
        v315[at + 1] = 8028;
        assert_eq!(offsets(&v315).unwrap().support, 344);
        // A free-threaded build is not read.
        let mut ft = v314.to_vec();
        ft[1] = 1;
        assert_eq!(offsets(&ft), None);
    }
}
