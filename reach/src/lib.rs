//! memshim-reach: reaching a running process that was started without the
//! preload (x86_64 Linux). A native ptrace injector: no gdb.
//!
//! * [`check`]: the refusals, decided before anything is touched, and
//!   which CPython the process runs.
//! * [`symbols`]: functions in the target, from its maps and the dynamic
//!   symbol tables of its files.
//! * [`inject`]: a thread held at a safe point, calls on it, every
//!   register and the interrupted system call restored.
//! * [`remote_exec`]: CPython 3.14+'s remote debugging (PEP 768), for a
//!   process no thread of which reaches a safe point.
//! * `ptrace`: the raw system calls, the crate's only `unsafe`.
//!
//! On other architectures `inject` is inject_other.rs: holding a thread
//! fails at once, so the CLI builds (the aarch64 wheel) and says so.
//!
//! The CLI has no `unsafe` (but one constructor, output/closed.rs); this
//! crate is where its system calls live
//! (docs/design.md, "Reaching a process started without the preload").

pub mod check;
mod failure;
#[cfg(target_arch = "x86_64")]
pub mod inject;
#[cfg(not(target_arch = "x86_64"))]
#[path = "inject_other.rs"]
pub mod inject;
mod ptrace;
pub mod remote_exec;
pub mod symbols;

pub use check::{Python, Refusal, Refused};
pub use failure::Failure;
pub use ptrace::{Interruptible, mounted_noexec};
use std::time::Duration;

/// Why an operation did not happen.
#[derive(Debug)]
pub enum Error {
    /// Refused before anything was touched.
    Refused(Refused),
    /// Tried, and nothing was changed (or, for [`Failure::Io`] after a
    /// call, said so).
    Failed(Failure),
}

impl From<Failure> for Error {
    fn from(f: Failure) -> Error {
        Error::Failed(f)
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::Failed(Failure::from(e))
    }
}

impl From<Refused> for Error {
    fn from(r: Refused) -> Error {
        Error::Refused(r)
    }
}

/// Where a call ran.
#[derive(Debug, Clone)]
pub struct Done {
    /// The thread it ran on.
    pub tid: i32,
    /// The system call that thread was waiting in.
    pub syscall: &'static str,
    /// What the last call returned.
    pub value: u64,
    /// `dlerror()`'s message when `dlopen` returned NULL.
    pub error: Option<String>,
}

/// The checks of [`check::may_trace`] and [`check::python`], with the
/// target's symbols.
pub fn examine(pid: i32) -> Result<(Python, symbols::Resolver), Error> {
    check::may_trace(pid)?;
    let mut syms = symbols::Resolver::new(pid).map_err(|_| Error::Failed(Failure::Gone))?;
    let py = check::python(pid, &mut syms)?;
    Ok((py, syms))
}

fn need(syms: &mut symbols::Resolver, names: &[&str]) -> Result<u64, Error> {
    names
        .iter()
        .find_map(|n| syms.find(n))
        .map(|(a, _)| a)
        .ok_or_else(|| {
            Error::Failed(Failure::Io(format!(
                "no {} in the process's files",
                names.join(" or ")
            )))
        })
}

/// Loads the shared library `path` (a path the target can open) into the
/// CPython process `pid` with `dlopen(path, RTLD_NOW | RTLD_LOCAL)`, on a
/// thread at a safe point found within `limit`.
pub fn dlopen(pid: i32, path: &str, limit: Duration) -> Result<Done, Error> {
    let (_py, mut syms) = examine(pid)?;
    let dlopen = need(&mut syms, &["dlopen", "__libc_dlopen_mode"])?;
    let dlerror = syms.find("dlerror").map(|(a, _)| a);
    let _hold = ptrace::HoldSignals::new();
    let mut held = inject::hold(pid, limit, |t| t != pid)?;
    let mut name = path.as_bytes().to_vec();
    name.push(0);
    let at = held.put(0, &name)?;
    let handle = held.call(dlopen, &[at, (libc::RTLD_NOW | libc::RTLD_LOCAL) as u64])?;
    let mut error = None;
    if let (0, Some(f)) = (handle, dlerror) {
        let msg = held.call(f, &[])?;
        if msg != 0 {
            error = held.read_cstr(msg, 1024).ok();
        }
    }
    let done = Done {
        tid: held.tid,
        syscall: held.syscall,
        value: handle,
        error,
    };
    held.finish()?;
    Ok(done)
}

/// A CPython process held at a safe point, on which its C API is called
/// (`PyGILState_Ensure`, the steps, `PyGILState_Release`), then the
/// process's own allocator (`malloc_trim(0)`).
pub struct PythonCalls {
    held: inject::Held,
    /// The CPython the process runs.
    pub python: Python,
    ensure: u64,
    release: u64,
    initialized: u64,
    import: u64,
    call_method: u64,
    as_ssize: u64,
    decref: u64,
    err_clear: u64,
    run: u64,
    modules: Option<u64>,
    get_item: Option<u64>,
    trim: Option<u64>,
    eval: Option<Eval>,
    threads: Option<Threads>,
    gc_is_enabled: Option<u64>,
    this_state: Option<u64>,
    malloc_stats: Option<MallocStats>,
    /// Whether the held thread had a thread state before we took the GIL
    /// (`PyGILState_Ensure` makes one for a thread that had none).
    had_state: bool,
    /// `PyGILState_Ensure`'s answer while the GIL is held.
    gil: Option<u64>,
    _signals: ptrace::HoldSignals,
}

/// The functions [`PythonCalls::eval`] calls.
#[derive(Debug, Clone, Copy)]
struct Eval {
    add_module: u64,
    module_dict: u64,
    run_string: u64,
    as_utf8: u64,
}

/// The functions [`PythonCalls::threads`] calls.
#[derive(Debug, Clone, Copy)]
struct Threads {
    main: u64,
    head: u64,
    next: u64,
}

/// The functions [`PythonCalls::malloc_stats`] calls.
#[derive(Debug, Clone, Copy)]
struct MallocStats {
    debug_malloc_stats: u64,
    open_memstream: u64,
    fclose: u64,
    free: u64,
}

/// CPython's `Py_eval_input`: the start symbol of an expression.
const PY_EVAL_INPUT: u64 = 258;

/// Holds a thread of the CPython process `pid` at a safe point (within
/// `limit`), after the refusals.
pub fn python(pid: i32, limit: Duration) -> Result<PythonCalls, Error> {
    let (python, mut syms) = examine(pid)?;
    let ensure = need(&mut syms, &["PyGILState_Ensure"])?;
    let release = need(&mut syms, &["PyGILState_Release"])?;
    let initialized = need(&mut syms, &["Py_IsInitialized"])?;
    let import = need(&mut syms, &["PyImport_ImportModule"])?;
    let call_method = need(&mut syms, &["PyObject_CallMethod"])?;
    let as_ssize = need(&mut syms, &["PyLong_AsSsize_t"])?;
    let decref = need(&mut syms, &["Py_DecRef"])?;
    let err_clear = need(&mut syms, &["PyErr_Clear"])?;
    let run = need(&mut syms, &["PyRun_SimpleString"])?;
    let modules = syms.find("PyImport_GetModuleDict").map(|(a, _)| a);
    let get_item = syms.find("PyDict_GetItemString").map(|(a, _)| a);
    // Only where glibc's malloc is the process's: the stream's buffer is
    // then glibc's to free (another allocator's would be another `free`).
    let glibc_heap = !syms.defined_beside_libc("malloc");
    // glibc's `malloc_trim` gives back nothing of another allocator's heap
    // (a preloaded jemalloc or tcmalloc).
    let trim = syms
        .find("malloc_trim")
        .map(|(a, _)| a)
        .filter(|_| glibc_heap);
    let mut find = |n: &str| syms.find(n).map(|(a, _)| a);
    let eval = (|| {
        Some(Eval {
            add_module: find("PyImport_AddModule")?,
            module_dict: find("PyModule_GetDict")?,
            run_string: find("PyRun_StringFlags")?,
            as_utf8: find("PyUnicode_AsUTF8")?,
        })
    })();
    let threads = (|| {
        Some(Threads {
            main: find("PyInterpreterState_Main")?,
            head: find("PyInterpreterState_ThreadHead")?,
            next: find("PyThreadState_Next")?,
        })
    })();
    let malloc_stats = (|| {
        glibc_heap.then_some(())?;
        Some(MallocStats {
            debug_malloc_stats: find("_PyObject_DebugMallocStats")?,
            open_memstream: find("open_memstream")?,
            fclose: find("fclose")?,
            free: find("free")?,
        })
    })();
    let gc_is_enabled = find("PyGC_IsEnabled");
    let this_state = find("PyGILState_GetThisThreadState");
    let signals = ptrace::HoldSignals::new();
    // The main thread first: where a server idles.
    let held = inject::hold(pid, limit, |t| t == pid)?;
    Ok(PythonCalls {
        held,
        python,
        ensure,
        release,
        initialized,
        import,
        call_method,
        as_ssize,
        decref,
        err_clear,
        run,
        modules,
        get_item,
        trim,
        eval,
        threads,
        gc_is_enabled,
        this_state,
        malloc_stats,
        had_state: true,
        gil: None,
        _signals: signals,
    })
}

impl PythonCalls {
    /// The thread the calls run on.
    pub fn tid(&self) -> i32 {
        self.held.tid
    }

    /// The system call it was waiting in.
    pub fn syscall(&self) -> &'static str {
        self.held.syscall
    }

    /// Takes the GIL on the held thread (`PyGILState_Ensure`), after
    /// checking that the interpreter runs (`Py_IsInitialized`).
    pub fn lock(&mut self) -> Result<(), Error> {
        if self.gil.is_some() {
            return Ok(());
        }
        if self.held.call(self.initialized, &[])? & 0xffff_ffff == 0 {
            return Err(Error::Failed(Failure::NotInitialised));
        }
        if let Some(f) = self.this_state {
            self.had_state = self.held.call(f, &[])? != 0;
        }
        self.gil = Some(self.held.call(self.ensure, &[])? & 0xffff_ffff);
        Ok(())
    }

    /// The value of the Python expression `expr`, which must make a `str`,
    /// evaluated in `__main__`'s namespace (it must not assign): `None` if
    /// it raised (cleared, never printed) or did not make a `str`. At most
    /// 3 KiB of it (it is written on the held thread's stack) and 64 KiB of
    /// the answer, which comes back through the process's memory, never
    /// its output.
    pub fn eval(&mut self, expr: &str) -> Result<Option<String>, Error> {
        let Some(e) = self.eval else {
            return Ok(None);
        };
        self.lock()?;
        let mut text = expr.as_bytes().to_vec();
        text.push(0);
        let main = self.held.put(0, b"__main__\0")?;
        let code = self.held.put(16, &text)?;
        let module = self.held.call(e.add_module, &[main])?; // borrowed
        if module == 0 {
            self.held.call(self.err_clear, &[])?;
            return Ok(None);
        }
        let globals = self.held.call(e.module_dict, &[module])?; // borrowed
        let value = self
            .held
            .call(e.run_string, &[code, PY_EVAL_INPUT, globals, globals, 0])?;
        if value == 0 {
            self.held.call(self.err_clear, &[])?;
            return Ok(None);
        }
        let utf8 = self.held.call(e.as_utf8, &[value])?;
        let answer = if utf8 == 0 {
            self.held.call(self.err_clear, &[])?;
            None
        } else {
            Some(self.held.read_cstr(utf8, 64 * 1024)?)
        };
        self.held.call(self.decref, &[value])?;
        Ok(answer)
    }

    /// `PyGC_IsEnabled()` (CPython 3.10+), `None` before 3.10.
    pub fn gc_is_enabled(&mut self) -> Result<Option<bool>, Error> {
        let Some(f) = self.gc_is_enabled else {
            return Ok(None);
        };
        self.lock()?;
        Ok(Some(self.held.call(f, &[])? & 0xffff_ffff != 0))
    }

    /// Thread states of the main interpreter, not counting one that taking
    /// the GIL made for the held thread; `None` without the functions.
    pub fn threads(&mut self) -> Result<Option<u64>, Error> {
        let Some(t) = self.threads else {
            return Ok(None);
        };
        self.lock()?;
        let interp = self.held.call(t.main, &[])?;
        let mut n: u64 = 0;
        let mut state = self.held.call(t.head, &[interp])?;
        while state != 0 && n < 100_000 {
            n += 1;
            state = self.held.call(t.next, &[state])?;
        }
        Ok(Some(if self.had_state {
            n
        } else {
            n.saturating_sub(1)
        }))
    }

    /// `gc.collect()`, called as Python code calls it (the C API's
    /// `PyGC_Collect` does nothing while the collector is disabled):
    /// unreachable objects found, or `None` if it raised (the exception is
    /// cleared, never printed). Run as Python code (`PyRun_StringFlags`)
    /// where [`Self::eval`] can: through `PyObject_CallMethod` the process
    /// kept one more pymalloc arena after the collection (1 MiB on CPython
    /// 3.10, the same when gdb made those calls). That call is the way
    /// where it cannot (or the code raised).
    pub fn gc_collect(&mut self) -> Result<Option<i64>, Error> {
        if let Some(n) = self.eval("str(__import__('gc').collect())")? {
            return Ok(n.parse().ok());
        }
        self.lock()?;
        let gc = self.held.put(0, b"gc\0")?;
        let collect = self.held.put(8, b"collect\0")?;
        let module = self.held.call(self.import, &[gc])?;
        if module == 0 {
            self.held.call(self.err_clear, &[])?;
            return Ok(None);
        }
        let result = self.held.call(self.call_method, &[module, collect, 0])?;
        self.held.call(self.decref, &[module])?;
        if result == 0 {
            self.held.call(self.err_clear, &[])?;
            return Ok(None);
        }
        let n = self.held.call(self.as_ssize, &[result])? as i64;
        self.held.call(self.decref, &[result])?;
        if n < 0 {
            self.held.call(self.err_clear, &[])?;
            return Ok(None);
        }
        Ok(Some(n))
    }

    /// What `sys._debugmallocstats()` would print (pymalloc's arenas and
    /// size classes), written by `_PyObject_DebugMallocStats` into a
    /// stream in the process's memory (`open_memstream`, freed after), and
    /// read from there: never the process's stderr. `None` where CPython
    /// does not export the function, or pymalloc is not its allocator (it
    /// wrote nothing). At most 64 KiB.
    pub fn malloc_stats(&mut self) -> Result<Option<String>, Error> {
        let Some(m) = self.malloc_stats else {
            return Ok(None);
        };
        self.lock()?;
        // open_memstream's two out-parameters: the buffer and its size.
        let slots = self.held.put(0, &[0u8; 16])?;
        let fp = self.held.call(m.open_memstream, &[slots, slots + 8])?;
        if fp == 0 {
            return Ok(None);
        }
        let wrote = self.held.call(m.debug_malloc_stats, &[fp])? & 0xffff_ffff != 0;
        // fclose flushes and leaves the buffer's address in the slot.
        let closed = self.held.call(m.fclose, &[fp])? & 0xffff_ffff == 0;
        let buf = self.held.read_u64(slots)?;
        if buf == 0 {
            return Ok(None);
        }
        let text = self.held.read_cstr(buf, 64 * 1024);
        self.held.call(m.free, &[buf])?;
        let text = text?;
        Ok((wrote && closed && !text.is_empty()).then_some(text))
    }

    /// Whether `sys.modules` has `name` (without importing it).
    pub fn imported(&mut self, name: &str) -> Result<bool, Error> {
        let (Some(modules), Some(get)) = (self.modules, self.get_item) else {
            return Ok(false);
        };
        self.lock()?;
        let dict = self.held.call(modules, &[])?;
        if dict == 0 {
            return Ok(false);
        }
        let mut n = name.as_bytes().to_vec();
        n.push(0);
        let at = self.held.put(0, &n)?;
        Ok(self.held.call(get, &[dict, at])? != 0)
    }

    /// `PyRun_SimpleString(code)`: true if it ran without an exception.
    /// The code must catch its own exceptions: an uncaught one is printed
    /// to the target's stderr.
    pub fn run(&mut self, code: &str) -> Result<bool, Error> {
        self.lock()?;
        let mut text = code.as_bytes().to_vec();
        text.push(0);
        let at = self.held.put(0, &text)?;
        Ok(self.held.call(self.run, &[at])? & 0xffff_ffff == 0)
    }

    /// Gives the GIL back (`PyGILState_Release`) if we hold it.
    pub fn unlock(&mut self) -> Result<(), Error> {
        if let Some(state) = self.gil.take() {
            self.held.call(self.release, &[state])?;
        }
        Ok(())
    }

    /// `malloc_trim(0)` (the GIL given back first): `Some(true)` if memory
    /// went back to the OS, `None` without glibc's malloc_trim or where
    /// another allocator's `malloc` is the process's.
    pub fn malloc_trim(&mut self) -> Result<Option<bool>, Error> {
        self.unlock()?;
        let Some(trim) = self.trim else {
            return Ok(None);
        };
        Ok(Some(self.held.call(trim, &[0])? & 0xffff_ffff != 0))
    }

    /// Gives the GIL back, restores the thread exactly and lets it go.
    pub fn finish(mut self) -> Result<(), Error> {
        let unlocked = self.unlock();
        self.held.finish()?;
        unlocked
    }
}
