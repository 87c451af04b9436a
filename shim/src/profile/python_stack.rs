//! Python frames inside native heap samples (docs/profile.md, "Python
//! lines in native profiles").
//!
//! jemalloc takes a sampled allocation's call stack through a hook
//! (`experimental.hooks.prof_backtrace`). The shim's hook calls jemalloc's
//! own (libgcc's unwinder), then, on a thread that has a CPython thread
//! state, walks that thread's own chain of Python frames and puts each
//! frame before the native frame of the `_PyEval_EvalFrameDefault` call
//! that runs it: the interleaving py-spy's `--native` shows. A Python frame
//! is an address no code has ([`memshim_proto::python_frame_address`]),
//! whose names frame_table.rs keeps. memshim-ctl folds the interpreter's
//! own C frames away when it shows the profile.
//!
//! Why it is safe inside an allocation, with or without the GIL:
//! * only the sampled thread's own frames are read. They cannot change or
//!   be freed while that thread is inside `malloc`: CPython links and
//!   unlinks a thread's frames only on that thread, and the code objects
//!   they run are held by them. The GIL guards other threads' frames,
//!   which are never read. A thread that released the GIL (PyTorch inside
//!   an op, ctypes in a foreign call) keeps its frames as they were.
//! * the CPython functions called are plain reads: `Py_IsInitialized`,
//!   the finalizing flag, `PyGILState_GetThisThreadState` (a
//!   `pthread_getspecific`), and the line of a frame
//!   (`PyFrame_GetLineNumber` before 3.11, `PyCode_Addr2Line` on 3.11,
//!   `PyUnstable_InterpreterFrame_GetLine` from 3.12), which decode the
//!   code object's line table. None allocates, locks or raises.
//! * no frame is read once the interpreter shuts down: other threads'
//!   states are freed then. The bridge's exit hook (python/gate.rs, which
//!   `profile` registers) stops new walks and waits for those under way
//!   before the runtime is marked finalizing, and ends them for good once
//!   it has finalized (an embedder may unload libpython); walks start only
//!   once it is registered. Each walk also checks the finalizing flag
//!   (under `MEMSHIM_PROFILE=start`, a CPython loaded with the program is
//!   walked from the start; until a request registers the hook, that
//!   check alone leaves a window of one walk).
//!   A walk stops at a null, misaligned or non-user-space pointer, at a
//!   frame whose code is not a code object, and after 128 frames.
//! * the struct offsets come from each version's headers, one row per
//!   minor version ([`LAYOUTS`]); on 3.13+ they are checked against the
//!   interpreter's own `_Py_DebugOffsets` before the first walk, and a
//!   mismatch leaves samples native-only.

use super::frame_table::{self, Key};
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::*};
use std::sync::OnceLock;

/// jemalloc's stack depth (`PROF_BT_MAX`).
const MAX_DEPTH: usize = 128;
/// Calls of the eval loop told apart in one stack (deeper ones go to the
/// outer end of the stack, in order).
const MAX_GROUPS: usize = 64;

/// How a minor version links a thread's frames.
#[derive(Clone, Copy, Debug)]
enum Chain {
    /// 3.8 to 3.10: `tstate->frame`, a `PyFrameObject` per eval call.
    Objects {
        frame: usize,
        back: usize,
        code: usize,
        lasti: usize,
    },
    /// 3.11: `tstate->cframe->current_frame`; one eval call runs frames
    /// up to the one marked `is_entry`.
    Entry {
        cframe: usize,
        current: usize,
        code: usize,
        previous: usize,
        prev_instr: usize,
        is_entry: usize,
        code_adaptive: usize,
    },
    /// 3.12 and later: the current frame (behind `tstate->cframe` on 3.12),
    /// each eval call's frames closed by a frame the C stack owns
    /// (`owner` 3 and up), whose executable is no code object.
    Owned {
        cframe: Option<usize>,
        current: usize,
        executable: usize,
        previous: usize,
        owner: usize,
        /// 3.14+: `f_executable` is a `_PyStackRef`, tagged in its low bits.
        tagged: bool,
        /// `prev_instr` (3.12) or `instr_ptr` (3.13+), and
        /// `co_code_adaptive`, where the instructions start.
        instr: usize,
        code_adaptive: usize,
    },
}

/// What the walk reads in one minor version, in bytes (`offsetof`).
#[derive(Clone, Copy, Debug)]
struct Layout {
    minor: u32,
    chain: Chain,
    co_filename: usize,
    /// `co_qualname` from 3.11, `co_name` before.
    co_name: usize,
    /// `sizeof(PyASCIIObject)`: a compact ASCII string's text follows.
    ascii_size: usize,
    /// `sizeof(PyCompactUnicodeObject)`, and its `utf8` pointer.
    compact_size: usize,
    compact_utf8: usize,
}

/// Owners from which a 3.12+ frame is not a Python function's
/// (`FRAME_OWNED_BY_CSTACK` on 3.12-3.13, `FRAME_OWNED_BY_INTERPRETER`
/// and `..._CSTACK` from 3.14).
const OWNED_BY_C: u8 = 3;

const fn objects(minor: u32) -> Layout {
    Layout {
        minor,
        chain: Chain::Objects {
            frame: 24,
            back: 24,
            code: 32,
            lasti: if minor >= 10 { 96 } else { 104 },
        },
        co_filename: 104,
        co_name: 112,
        ascii_size: 48,
        compact_size: 72,
        compact_utf8: 56,
    }
}

const fn owned(
    minor: u32,
    cframe: Option<usize>,
    current: usize,
    owner: usize,
    code_adaptive: usize,
) -> Layout {
    Layout {
        minor,
        chain: Chain::Owned {
            cframe,
            current,
            executable: 0,
            previous: 8,
            owner,
            tagged: minor >= 14,
            instr: 56,
            code_adaptive,
        },
        co_filename: 112,
        co_name: 128,
        ascii_size: 40,
        compact_size: 56,
        compact_utf8: 48,
    }
}

/// One row per minor version, from `offsetof` on its headers (pyenv's
/// 3.8.18 to 3.13.0) and, for 3.14 and 3.15 (whose headers Debian does
/// not ship here), from the `_Py_DebugOffsets` of Debian's 3.14.10 and
/// 3.15.2, which agree with 3.13's in every field the walk reads.
const LAYOUTS: [Layout; 8] = [
    objects(8),
    objects(9),
    objects(10),
    Layout {
        minor: 11,
        chain: Chain::Entry {
            cframe: 56,
            current: 8,
            code: 32,
            previous: 48,
            prev_instr: 56,
            is_entry: 68,
            code_adaptive: 184,
        },
        co_filename: 112,
        co_name: 128,
        ascii_size: 48,
        compact_size: 72,
        compact_utf8: 56,
    },
    owned(12, Some(56), 0, 70, 192),
    owned(13, None, 72, 70, 200),
    owned(14, None, 72, 74, 208),
    owned(15, None, 72, 74, 208),
];

type Hook = unsafe extern "C" fn(*mut *mut c_void, *mut u32, u32);
type IntFn = unsafe extern "C" fn() -> c_int;
type PtrFn = unsafe extern "C" fn() -> *mut c_void;
type LineOf = unsafe extern "C" fn(*mut c_void) -> c_int;
type Addr2Line = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;

/// The interpreter, as found once.
struct Interp {
    layout: Layout,
    initialized: IntFn,
    finalizing: IntFn,
    this_thread: PtrFn,
    /// `PyFrame_GetLineNumber` (3.8-3.10) or
    /// `PyUnstable_InterpreterFrame_GetLine` (3.12+).
    line_of: Option<LineOf>,
    /// `PyCode_Addr2Line` (3.11).
    addr2line: Option<Addr2Line>,
    code_type: usize,
    /// `_PyEval_EvalFrameDefault`'s code: [start, end).
    eval: (usize, usize),
}

/// jemalloc's own hook, called first; 0 until installed.
static DEFAULT: AtomicUsize = AtomicUsize::new(0);
/// Set once the interpreter is found; the walk reads it only after.
static INTERP: OnceLock<Interp> = OnceLock::new();
/// Whether samples get Python frames (the interpreter found and checked).
static WALK: AtomicBool = AtomicBool::new(false);
/// The interpreter is shutting down: no walk starts ([`shutdown`]).
static SHUTTING_DOWN: AtomicBool = AtomicBool::new(false);
touched_at_start! {
    /// Walks under way.
    static IN_FLIGHT: AtomicU32 = AtomicU32::new(0);
}

/// The interpreter found has finalized: its functions may be unloaded
/// with its library (an embedder's `dlclose`), so no walk calls them again.
static GONE: AtomicBool = AtomicBool::new(false);

/// Told by the bridge's exit hook (python/gate.rs) when the interpreter
/// starts to shut down, on the main thread before the runtime is marked
/// finalizing and other threads' states are freed: no walk starts after,
/// and those under way (microseconds each) end before it returns.
/// `false`: the interpreter has finalized; walks end for good (the
/// pointers to its functions are not looked up again).
fn shutdown(closing: bool) {
    if closing {
        SHUTTING_DOWN.store(true, SeqCst);
        crate::os::time::wait_while(100, std::time::Duration::from_micros(50), || {
            IN_FLIGHT.load(SeqCst) != 0
        });
    } else {
        GONE.store(true, SeqCst);
        WALK.store(false, SeqCst);
    }
}

/// Fork child: the walks other threads had under way stay in the parent
/// (an exit hook in the child would otherwise wait for them).
/// Async-signal-safe.
#[unsafe(link_section = ".text.startup")]
pub fn after_fork_child() {
    use crate::os::ResetTo;
    IN_FLIGHT.reset_to(0);
}

/// Whether samples get Python frames.
pub fn ready() -> bool {
    WALK.load(Acquire)
}

/// Samples get Python frames from now on, once [`prepare`] found the
/// interpreter: from the constructor (a CPython loaded with the program,
/// which cannot be unloaded), or once the bridge's exit hooks are
/// registered (`profile/mod.rs`), which end the walks when it finalizes.
pub fn enable() {
    if INTERP.get().is_some() && !GONE.load(SeqCst) {
        WALK.store(true, Release);
    }
}

/// Before sampling starts (the shim's thread, or the constructor under
/// `MEMSHIM_PROFILE=start`): installs the hook once, and looks for a
/// CPython whose frames it can walk, until one is found. Returns why
/// samples cannot get Python frames, if they cannot.
pub fn prepare() -> Option<&'static str> {
    if DEFAULT.load(Acquire) == 0 {
        let Ok(own) = crate::jemalloc::prof_backtrace_hook() else {
            return Some("this jemalloc has no backtrace hook");
        };
        DEFAULT.store(own as usize, Release);
        if crate::jemalloc::set_prof_backtrace_hook(backtrace).is_err() {
            DEFAULT.store(0, Release);
            return Some("jemalloc refused the backtrace hook");
        }
    }
    if INTERP.get().is_none() {
        match find() {
            Ok(i) => {
                let _ = INTERP.set(i);
                crate::python::on_shutdown(shutdown);
            }
            Err(why) => return Some(why),
        }
    }
    None
}

fn sym(name: &core::ffi::CStr) -> usize {
    crate::os::dl::in_global_scope(name) as usize
}

/// The CPython in the process's global scope, and what its frames look
/// like; why not, if it cannot be walked.
fn find() -> Result<Interp, &'static str> {
    let minor = crate::python::served_minor()
        .ok_or("no CPython the bridge serves in the process's global scope")?;
    let layout = *LAYOUTS
        .iter()
        .find(|l| l.minor == minor)
        .ok_or("a CPython version whose frames memshim does not know")?;
    if layout.minor >= 13 && !debug_offsets_agree(&layout) {
        return Err("this CPython's _Py_DebugOffsets differ from the offsets memshim knows");
    }
    let finalizing = match sym(c"Py_IsFinalizing") {
        0 => sym(c"_Py_IsFinalizing"),
        f => f,
    };
    let (initialized, this_thread, code_type, eval) = (
        sym(c"Py_IsInitialized"),
        sym(c"PyGILState_GetThisThreadState"),
        sym(c"PyCode_Type"),
        sym(c"_PyEval_EvalFrameDefault"),
    );
    let line_of = match layout.minor {
        ..=10 => sym(c"PyFrame_GetLineNumber"),
        11 => 0,
        _ => sym(c"PyUnstable_InterpreterFrame_GetLine"),
    };
    let addr2line = if layout.minor == 11 {
        sym(c"PyCode_Addr2Line")
    } else {
        0
    };
    // The eval loop's extent places the frames before 3.11 only (from
    // 3.11 its markers on the C stack do).
    let size = symbol_size(eval);
    if [initialized, finalizing, this_thread, code_type].contains(&0)
        || (line_of == 0 && addr2line == 0)
        || (layout.minor < 11 && size == 0)
    {
        return Err("a CPython function the walk needs is not exported");
    }
    // SAFETY: each is the named CPython function, whose signature is the
    // type it is transmuted to.
    unsafe {
        Ok(Interp {
            layout,
            initialized: core::mem::transmute::<usize, IntFn>(initialized),
            finalizing: core::mem::transmute::<usize, IntFn>(finalizing),
            this_thread: core::mem::transmute::<usize, PtrFn>(this_thread),
            line_of: (line_of != 0).then(|| core::mem::transmute::<usize, LineOf>(line_of)),
            addr2line: (addr2line != 0)
                .then(|| core::mem::transmute::<usize, Addr2Line>(addr2line)),
            code_type,
            eval: (eval, eval + size),
        })
    }
}

/// The size of the function at `addr` (its symbol's `st_size`), 0 if
/// unknown.
fn symbol_size(addr: usize) -> usize {
    if addr == 0 {
        return 0;
    }
    crate::os::dl::symbol_of(addr)
        .filter(|&(start, _)| start == addr)
        .map_or(0, |(_, s)| s.st_size as usize)
}

/// 3.13+: whether the interpreter's `_Py_DebugOffsets` (the start of
/// `_PyRuntime`) have every offset this layout reads where it has them.
fn debug_offsets_agree(l: &Layout) -> bool {
    let Chain::Owned {
        current,
        executable,
        previous,
        owner,
        instr,
        code_adaptive,
        ..
    } = l.chain
    else {
        return false;
    };
    let rt = sym(c"_PyRuntime");
    if rt == 0 {
        return false;
    }
    // SAFETY: `_PyRuntime` is a static struct far larger than 8 + 8 * 96
    // bytes; its first member (3.13+) is `_Py_DebugOffsets`.
    let (cookie, a) = unsafe {
        (
            core::slice::from_raw_parts(rt as *const u8, 8),
            core::slice::from_raw_parts((rt + 8) as *const u64, 96),
        )
    };
    let u = |v: usize| v as u64;
    // thread state: prev, next, interp, current_frame; frame: previous,
    // executable, instr_ptr, localsplus, owner; code: filename, name,
    // qualname, linetable, firstlineno, argcount, localsplusnames,
    // localspluskinds, co_code_adaptive.
    cookie == b"xdebugpy"
        && a.windows(4).any(|w| w == [0, 8, 16, u(current)])
        && a.windows(5).any(|w| {
            w[0] == u(previous) && w[1] == u(executable) && w[2] == u(instr) && w[4] == u(owner)
        })
        && a.windows(9).any(|w| {
            w[..3] == [u(l.co_filename), u(l.co_filename) + 8, u(l.co_name)]
                && w[8] == u(code_adaptive)
        })
}

/// Whether `p` can be a pointer to an object of the process.
#[inline]
fn plausible(p: usize) -> bool {
    p >= 4096 && p & 7 == 0 && p < (1 << 47)
}

/// Reads a word at `p + off`.
///
/// # Safety
/// `p` must point to a live object of which `off` is a word's offset.
#[inline]
unsafe fn word(p: usize, off: usize) -> usize {
    // SAFETY: the caller's.
    unsafe { core::ptr::read((p + off) as *const usize) }
}

/// The hook: on a thread with Python frames, the native stack with them
/// woven in; else jemalloc's own.
unsafe extern "C" fn backtrace(vec: *mut *mut c_void, len: *mut u32, max: u32) {
    if WALK.load(Acquire)
        && let Some(i) = INTERP.get()
    {
        IN_FLIGHT.fetch_add(1, SeqCst);
        // SAFETY: jemalloc's buffer of `max` entries; no walk once the
        // exit hook has said the interpreter shuts down.
        let woven = !SHUTTING_DOWN.load(SeqCst)
            && unsafe { weave(i, vec.cast(), len, (max as usize).min(MAX_DEPTH)) };
        IN_FLIGHT.fetch_sub(1, SeqCst);
        if woven {
            return;
        }
    }
    let own = DEFAULT.load(Relaxed);
    if own != 0 {
        // SAFETY: `own` is the hook jemalloc had before ours.
        unsafe { core::mem::transmute::<usize, Hook>(own)(vec, len, max) };
    }
}

/// Up to [`MAX_DEPTH`] addresses, innermost first.
struct Out {
    buf: [usize; MAX_DEPTH],
    n: usize,
    max: usize,
}

impl Out {
    fn push(&mut self, v: usize) -> bool {
        if self.n >= self.max {
            return false;
        }
        self.buf[self.n] = v;
        self.n += 1;
        true
    }

    fn extend(&mut self, vs: &[usize]) {
        for &v in vs {
            if !self.push(v) {
                return;
            }
        }
    }
}

/// The Python frames of one call of the eval loop, innermost first, and
/// where that call keeps its marker on the C stack (its `_PyCFrame` on
/// 3.11, its entry frame from 3.12; 0: unknown, before 3.11).
struct Group {
    from: u8,
    to: u8,
    anchor: usize,
}

impl Group {
    fn range(&self) -> core::ops::Range<usize> {
        usize::from(self.from)..usize::from(self.to)
    }
}

/// Takes the stack of this thread with its Python frames into `vec`
/// (`max` entries); false if the thread runs no Python code (then nothing
/// is written).
///
/// Each group of Python frames goes just inside the native frame that runs
/// it: from 3.11, the frame whose own stack holds the group's marker (the
/// unwinder gives each frame's stack bounds); before, the next frame in
/// `_PyEval_EvalFrameDefault` (one group per call there). A group whose
/// native frame the walk did not reach goes at the outer end.
///
/// # Safety
/// `vec` holds `max` entries; on the sampled thread, inside `malloc`.
unsafe fn weave(i: &Interp, vec: *mut usize, len: *mut u32, max: usize) -> bool {
    // SAFETY: plain reads of the runtime's state (module docs).
    let ts = unsafe {
        if (i.initialized)() == 0 || (i.finalizing)() != 0 {
            return false;
        }
        (i.this_thread)() as usize
    };
    if !plausible(ts) {
        return false;
    }
    let mut py = Out {
        buf: [0; MAX_DEPTH],
        n: 0,
        max,
    };
    let mut groups: [Group; MAX_GROUPS] = core::array::from_fn(|_| Group {
        from: 0,
        to: 0,
        anchor: 0,
    });
    // SAFETY: `ts` is this thread's own state.
    let ng = unsafe { python_groups(i, ts, &mut py, &mut groups) };
    if py.n == 0 {
        return false;
    }
    let mut ip = [0usize; MAX_DEPTH];
    let mut cfa = [0usize; MAX_DEPTH];
    let n = crate::os::unwind::frames(&mut ip[..max], &mut cfa[..max]);
    let mut out = Out {
        buf: [0; MAX_DEPTH],
        n: 0,
        max,
    };
    let mut g = 0;
    for k in 0..n {
        // From 3.11: the groups whose marker lies in this frame's stack.
        // libgcc gives each frame's context the CFA of the frame it called:
        // frame k's own stack runs from cfa[k] up to cfa[k + 1].
        let top = if k + 1 < n { cfa[k + 1] } else { usize::MAX };
        while g < ng && groups[g].anchor != 0 && groups[g].anchor < top {
            out.extend(&py.buf[groups[g].range()]);
            g += 1;
        }
        // Before: the next group, if this is a call of the eval loop.
        if groups[..ng].get(g).is_some_and(|gr| gr.anchor == 0)
            && ip[k] > i.eval.0
            && ip[k] <= i.eval.1
        {
            out.extend(&py.buf[groups[g].range()]);
            g += 1;
        }
        out.push(ip[k]);
    }
    for gr in &groups[g..ng] {
        out.extend(&py.buf[gr.range()]);
    }
    // SAFETY: `out.n <= max` entries into jemalloc's buffer.
    unsafe {
        core::ptr::copy_nonoverlapping(out.buf.as_ptr(), vec, out.n);
        *len = out.n as u32;
    }
    true
}

/// Opens the next group at `py`'s end; false when no more fit.
fn open(groups: &mut [Group], py: &Out, ng: &mut usize, anchor: usize) -> bool {
    if *ng >= groups.len() || py.n >= py.max {
        return false;
    }
    groups[*ng] = Group {
        from: py.n as u8,
        to: py.n as u8,
        anchor,
    };
    *ng += 1;
    true
}

/// This thread's Python frames, innermost first, into `py`, by call of
/// the eval loop into `groups`; how many groups.
///
/// # Safety
/// `ts` is the calling thread's own thread state.
unsafe fn python_groups(i: &Interp, ts: usize, py: &mut Out, groups: &mut [Group]) -> usize {
    let l = &i.layout;
    let mut ng = 0;
    // SAFETY: (the whole body) this thread's frames and the code objects they
    // hold, each pointer checked with `plausible` before it is read.
    unsafe {
        match l.chain {
            Chain::Objects {
                frame,
                back,
                code,
                lasti,
            } => {
                let mut f = word(ts, frame);
                while plausible(f) && open(groups, py, &mut ng, 0) {
                    let co = word(f, code);
                    if is_code(i, co) {
                        let at = *((f + lasti) as *const i32) as isize;
                        let line = || i.line_of.map_or(0, |g| g(f as *mut c_void));
                        emit(l, co, at, line, py);
                    }
                    groups[ng - 1].to = py.n as u8;
                    f = word(f, back);
                }
            }
            Chain::Entry {
                cframe,
                current,
                code,
                previous,
                prev_instr,
                is_entry,
                code_adaptive,
            } => {
                // One `_PyCFrame` per call, on the C stack; the root one,
                // in the thread state, runs no frame.
                let mut c = word(ts, cframe);
                while plausible(c) && open(groups, py, &mut ng, c) {
                    let mut f = word(c, current);
                    for _ in 0..MAX_DEPTH {
                        if !plausible(f) {
                            break;
                        }
                        let co = word(f, code);
                        if is_code(i, co) {
                            let at = word(f, prev_instr) as isize - (co + code_adaptive) as isize;
                            let line = || {
                                i.addr2line
                                    .map_or(0, |g| g(co as *mut c_void, at.max(-1) as c_int))
                            };
                            emit(l, co, at, line, py);
                        }
                        if *((f + is_entry) as *const u8) != 0 {
                            break;
                        }
                        f = word(f, previous);
                    }
                    groups[ng - 1].to = py.n as u8;
                    // `previous` follows `current_frame` in `_PyCFrame`.
                    c = word(c, current + 8);
                }
            }
            Chain::Owned {
                cframe,
                current,
                executable,
                previous,
                owner,
                tagged,
                instr,
                code_adaptive,
            } => {
                let mut f = match cframe {
                    Some(cf) => {
                        let c = word(ts, cf);
                        if plausible(c) { word(c, current) } else { 0 }
                    }
                    None => word(ts, current),
                };
                // Frames up to each entry frame (the eval loop's local,
                // on the C stack) are one call's.
                let mut in_group = false;
                for _ in 0..4 * MAX_DEPTH {
                    if !plausible(f) {
                        break;
                    }
                    if !in_group {
                        if !open(groups, py, &mut ng, 0) {
                            break;
                        }
                        in_group = true;
                    }
                    if *((f + owner) as *const u8) >= OWNED_BY_C {
                        groups[ng - 1].anchor = f;
                        groups[ng - 1].to = py.n as u8;
                        in_group = false;
                    } else {
                        let mut co = word(f, executable);
                        if tagged {
                            co &= !7;
                        }
                        if is_code(i, co) {
                            let at = word(f, instr) as isize - (co + code_adaptive) as isize;
                            let line = || i.line_of.map_or(0, |g| g(f as *mut c_void));
                            emit(l, co, at, line, py);
                        }
                        groups[ng - 1].to = py.n as u8;
                    }
                    f = word(f, previous);
                }
            }
        }
    }
    // Groups with no frame (a call that has not pushed one yet) are kept:
    // they are empty, and keep the pairing with the native frames.
    ng
}

/// Whether `co` is a code object.
///
/// # Safety
/// `co` is 0 or a pointer a frame holds.
#[inline]
unsafe fn is_code(i: &Interp, co: usize) -> bool {
    // SAFETY: `ob_type` of the object a frame holds.
    plausible(co) && unsafe { word(co, 8) } == i.code_type
}

/// Pushes the address of code `co` at instruction offset `at`: the first
/// time, its names are copied into the table and its line decoded
/// (`line`), which a frame already there (the same objects with the same
/// names) skips.
///
/// # Safety
/// `co` is a live code object.
unsafe fn emit(l: &Layout, co: usize, at: isize, line: impl FnOnce() -> c_int, out: &mut Out) {
    // SAFETY: fields of a live code object.
    let (file, name) = unsafe { (word(co, l.co_filename), word(co, l.co_name)) };
    let key = Key {
        code: co,
        file,
        name,
        at: at as u32,
    };
    // The names each time: the table compares them, as the objects' addresses
    // may be those of freed ones (frame_table::intern).
    let mut fb = [0u8; frame_table::FILE_BYTES];
    let mut nb = [0u8; frame_table::FUNCTION_BYTES];
    // SAFETY: the code object's name strings, alive with it.
    let (f, n) = unsafe { (text(l, file, &mut fb, true), text(l, name, &mut nb, false)) };
    let id = frame_table::intern(key, &fb[..f], &nb[..n], || line().max(0) as u32);
    out.push(memshim_proto::python_frame_address(id) as usize);
}

/// Copies the text of the `str` at `obj` into `out` as UTF-8 (its end if
/// `tail` and it is too long, after `...`); its length in `out`.
///
/// # Safety
/// `obj` is 0 or a live `str` object.
unsafe fn text(l: &Layout, obj: usize, out: &mut [u8], tail: bool) -> usize {
    let unknown = |out: &mut [u8]| {
        out[0] = b'?';
        1
    };
    if !plausible(obj) || out.len() < 8 {
        return unknown(out);
    }
    // SAFETY: the fields of a live str object (PyASCIIObject: length at
    // 16, state at 32; compact ones keep their text after the header).
    unsafe {
        let len = word(obj, 16) as isize;
        let state = *((obj + 32) as *const u32);
        let (kind, compact, ascii) = (
            (state >> 2) & 7,
            state & (1 << 5) != 0,
            state & (1 << 6) != 0,
        );
        if !(0..1 << 20).contains(&len) || !compact {
            return unknown(out);
        }
        if ascii {
            let s = core::slice::from_raw_parts((obj + l.ascii_size) as *const u8, len as usize);
            return clip(s, out, tail);
        }
        let utf8 = word(obj, l.compact_utf8);
        if plausible(utf8 & !7) && utf8 != 0 {
            let n = word(obj, l.compact_utf8 - 8).min(1 << 20);
            return clip(core::slice::from_raw_parts(utf8 as *const u8, n), out, tail);
        }
        // No UTF-8 copy: encode the code points (kind 1, 2 or 4 bytes).
        if !matches!(kind, 1 | 2 | 4) {
            return unknown(out);
        }
        let data = obj + l.compact_size;
        let len = len as usize;
        // SAFETY: k < len, inside the string's data of `kind`-byte units.
        let at = |k: usize| {
            let c = match kind {
                1 => u32::from(*((data + k) as *const u8)),
                2 => u32::from(*((data + 2 * k) as *const u16)),
                _ => *((data + 4 * k) as *const u32),
            };
            char::from_u32(c).unwrap_or('?')
        };
        let (mut k, mut n) = (0, 0);
        if tail {
            let total: usize = (0..len).map(|k| at(k).len_utf8()).sum();
            if total > out.len() {
                // Its end, whole characters, after `...`.
                out[..3].copy_from_slice(b"...");
                n = 3;
                let mut dropped = 0;
                while dropped < total - (out.len() - 3) {
                    dropped += at(k).len_utf8();
                    k += 1;
                }
            }
        }
        for k in k..len {
            let ch = at(k);
            if n + ch.len_utf8() > out.len() {
                break;
            }
            n += ch.encode_utf8(&mut out[n..]).len();
        }
        n
    }
}

/// `s` into `out`: whole if it fits, else its end after `...` (`tail`) or
/// its start.
fn clip(s: &[u8], out: &mut [u8], tail: bool) -> usize {
    if s.len() <= out.len() {
        out[..s.len()].copy_from_slice(s);
        return s.len();
    }
    // Cut between characters: a UTF-8 continuation byte is 0b10xxxxxx.
    let inside = |b: u8| b & 0xc0 == 0x80;
    if !tail {
        let mut n = out.len();
        while n > 0 && inside(s[n]) {
            n -= 1;
        }
        out[..n].copy_from_slice(&s[..n]);
        return n;
    }
    let mut from = s.len() - (out.len() - 3);
    while from < s.len() && inside(s[from]) {
        from += 1;
    }
    let keep = s.len() - from;
    out[..3].copy_from_slice(b"...");
    out[3..3 + keep].copy_from_slice(&s[from..]);
    3 + keep
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_file_name_keeps_its_end_and_a_long_function_its_start() {
        let mut out = [0u8; 8];
        assert_eq!(clip(b"abc", &mut out, true), 3);
        assert_eq!(&out[..3], b"abc");
        let n = clip(b"/very/long/path.py", &mut out, true);
        assert_eq!(&out[..n], b"...th.py");
        let n = clip(b"a_long_function", &mut out, false);
        assert_eq!(&out[..n], b"a_long_f");
        // Cut between characters, never inside one (3 bytes each here).
        let n = clip("/プロジェクト.py".as_bytes(), &mut out, true);
        assert_eq!(core::str::from_utf8(&out[..n]), Ok("....py"));
        let mut nine = [0u8; 9];
        let n = clip("/プロジェクト.py".as_bytes(), &mut nine, true);
        assert_eq!(core::str::from_utf8(&nine[..n]), Ok("...ト.py"));
        let n = clip("計算キャッシュ".as_bytes(), &mut out, false);
        assert_eq!(core::str::from_utf8(&out[..n]), Ok("計算"));
    }

    #[test]
    fn each_served_minor_version_has_one_layout() {
        let (lo, hi) = memshim_proto::PYTHON_SERVED;
        let minors: Vec<u32> = LAYOUTS.iter().map(|l| l.minor).collect();
        assert_eq!(minors, (lo.1..=hi.1).collect::<Vec<_>>());
    }
}
