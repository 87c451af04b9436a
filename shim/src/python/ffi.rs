//! The slice of the CPython C API the bridge uses, declared by hand and
//! resolved at run time.
//!
//! The shim does not link against libpython: it must load into every
//! process, and a process hosts at most one CPython of any version (or
//! none). So each function is looked up in the global scope only
//! (`os::dl::in_global_scope`: what `dlsym(RTLD_DEFAULT, ...)` searches,
//! without pinning the library that answers), which is exactly where an
//! interpreter linked into the executable, or `dlopen`ed `RTLD_GLOBAL`,
//! puts its symbols. An interpreter embedded `RTLD_LOCAL` is invisible
//! there and the process is treated as having no Python.
//!
//! Resolution happens on the shim's own thread only (`api()` is called by
//! the request side in `job.rs`), never on the allocation path, in a
//! fork handler or a constructor: `dlsym` takes the loader's lock and may
//! allocate (its error buffer), and in the constructor a `dlopen`ed
//! interpreter would not be there yet. A failed lookup is not cached, so
//! an interpreter loaded later is found. A successful one is checked at
//! every request (one `dlsym`): an embedder that `dlclose`s its libpython
//! unmaps every address we hold, and one that loads another in its place
//! moves them, so the set is resolved again when `Py_GetVersion` is no
//! longer where it was ([`api`]).
//!
//! Only functions whose signatures are identical in every version the
//! bridge serves (`version.rs`) are required; those that only some versions
//! have are optional and say which. Every object is handled through
//! functions (`Py_DecRef`, never the `Py_DECREF` macro), because the object
//! header differs between versions and free-threaded builds. No struct of
//! CPython's is read, except `PyMethodDef`, whose layout is part of the
//! stable ABI.

use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::*};

/// An opaque CPython object.
pub type PyObject = c_void;

/// `PyCFunction`.
pub type PyCFunction = unsafe extern "C" fn(*mut PyObject, *mut PyObject) -> *mut PyObject;

/// `PyMethodDef` (stable ABI layout).
#[repr(C)]
pub struct PyMethodDef {
    /// Name.
    pub ml_name: *const c_char,
    /// The C function.
    pub ml_meth: Option<PyCFunction>,
    /// Calling convention flags.
    pub ml_flags: c_int,
    /// Docstring.
    pub ml_doc: *const c_char,
}

// SAFETY: the only instance is a static whose pointers are to static C
// strings and a function; it is never written after construction.
unsafe impl Sync for PyMethodDef {}

/// `METH_NOARGS`.
pub const METH_NOARGS: c_int = 0x0004;

/// A `Py_AtExit` callback.
pub type AtExitFn = extern "C" fn();

/// A `Py_AddPendingCall` callback: 0, or -1 with an exception set.
pub type PendingFn = unsafe extern "C" fn(*mut c_void) -> c_int;

macro_rules! api {
    (required { $( $(#[$m:meta])* $field:ident : $sym:literal => fn($($arg:ty),*) -> $ret:ty; )* }
     optional { $( $(#[$om:meta])* $ofield:ident : [$($osym:literal),+] => fn($($oarg:ty),*) -> $oret:ty; )* }) => {
        /// Resolved entry points. Each field documents its C function.
        pub struct Api {
            $( $(#[$m])* pub $field: unsafe extern "C" fn($($arg),*) -> $ret, )*
            $( $(#[$om])* pub $ofield: Option<unsafe extern "C" fn($($oarg),*) -> $oret>, )*
        }

        impl Api {
            fn resolve() -> Option<Api> {
                Some(Api {
                    $( $field: {
                        let p = sym(concat!($sym, "\0"));
                        if p.is_null() { return None; }
                        // SAFETY: the symbol of this name is this C function in
                        // every CPython the bridge serves (see the module comment).
                        unsafe { core::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> $ret>(p) }
                    }, )*
                    $( $ofield: {
                        let mut found = None;
                        for s in [$(concat!($osym, "\0")),+] {
                            let p = sym(s);
                            if !p.is_null() {
                                // SAFETY: as above, for every name listed.
                                found = Some(unsafe { core::mem::transmute::<*mut c_void, unsafe extern "C" fn($($oarg),*) -> $oret>(p) });
                                break;
                            }
                        }
                        found
                    }, )*
                })
            }
        }
    };
}

api! {
    required {
    /// `int Py_IsInitialized(void)`: callable without the GIL.
    is_initialized: "Py_IsInitialized" => fn() -> c_int;
    /// `const char *Py_GetVersion(void)`: a static string.
    get_version: "Py_GetVersion" => fn() -> *const c_char;
    /// `PyObject *PyImport_GetModuleDict(void)`: borrowed `sys.modules`.
    import_get_module_dict: "PyImport_GetModuleDict" => fn() -> *mut PyObject;
    /// `PyObject *PyDict_GetItemString(PyObject *, const char *)`: borrowed,
    /// no exception on a missing key.
    dict_get_item_string: "PyDict_GetItemString" => fn(*mut PyObject, *const c_char) -> *mut PyObject;
    /// `PyObject *PyImport_ImportModuleLevel(const char *, globals, locals,
    /// fromlist, level)`: new; imports through `sys.meta_path` (not a
    /// replaced `builtins.__import__`). Used for `atexit` only (`gate.rs`).
    import_module_level: "PyImport_ImportModuleLevel" => fn(*const c_char, *mut PyObject, *mut PyObject, *mut PyObject, c_int) -> *mut PyObject;
    /// `PyObject *PySys_GetObject(const char *)`: borrowed `sys.<name>`.
    sys_get_object: "PySys_GetObject" => fn(*const c_char) -> *mut PyObject;
    /// `PyObject *PyObject_GetAttrString(PyObject *, const char *)`: new.
    get_attr_string: "PyObject_GetAttrString" => fn(*mut PyObject, *const c_char) -> *mut PyObject;
    /// `PyObject *PyObject_Call(PyObject *, PyObject *args, PyObject *kw)`: new.
    call: "PyObject_Call" => fn(*mut PyObject, *mut PyObject, *mut PyObject) -> *mut PyObject;
    /// `int PyObject_IsTrue(PyObject *)`: -1 on error.
    is_true: "PyObject_IsTrue" => fn(*mut PyObject) -> c_int;
    /// `PyObject *PyObject_Str(PyObject *)`: new.
    str_: "PyObject_Str" => fn(*mut PyObject) -> *mut PyObject;
    /// `PyObject *PyTuple_New(Py_ssize_t)`: new.
    tuple_new: "PyTuple_New" => fn(isize) -> *mut PyObject;
    /// `int PyTuple_SetItem(PyObject *, Py_ssize_t, PyObject *)`: steals.
    tuple_set_item: "PyTuple_SetItem" => fn(*mut PyObject, isize, *mut PyObject) -> c_int;
    /// `Py_ssize_t PySequence_Size(PyObject *)`.
    sequence_size: "PySequence_Size" => fn(*mut PyObject) -> isize;
    /// `PyObject *PySequence_GetItem(PyObject *, Py_ssize_t)`: new.
    sequence_get_item: "PySequence_GetItem" => fn(*mut PyObject, isize) -> *mut PyObject;
    /// `PyObject *PyMapping_GetItemString(PyObject *, const char *)`: new.
    mapping_get_item_string: "PyMapping_GetItemString" => fn(*mut PyObject, *const c_char) -> *mut PyObject;
    /// `PyObject *PyLong_FromLongLong(long long)`: new.
    long_from_i64: "PyLong_FromLongLong" => fn(i64) -> *mut PyObject;
    /// `long long PyLong_AsLongLong(PyObject *)`: -1 and an exception on error.
    long_as_i64: "PyLong_AsLongLong" => fn(*mut PyObject) -> i64;
    /// `const char *PyUnicode_AsUTF8(PyObject *)`.
    unicode_as_utf8: "PyUnicode_AsUTF8" => fn(*mut PyObject) -> *const c_char;
    /// `PyObject *PyErr_Occurred(void)`: borrowed.
    err_occurred: "PyErr_Occurred" => fn() -> *mut PyObject;
    /// `void PyErr_Fetch(PyObject **, PyObject **, PyObject **)`.
    err_fetch: "PyErr_Fetch" => fn(*mut *mut PyObject, *mut *mut PyObject, *mut *mut PyObject) -> ();
    /// `void Py_DecRef(PyObject *)` (NULL is allowed).
    dec_ref: "Py_DecRef" => fn(*mut PyObject) -> ();
    /// `void Py_IncRef(PyObject *)`.
    inc_ref: "Py_IncRef" => fn(*mut PyObject) -> ();
    /// `PyObject *PyCFunction_NewEx(PyMethodDef *, PyObject *self, PyObject *module)`.
    cfunction_new_ex: "PyCFunction_NewEx" => fn(*const PyMethodDef, *mut PyObject, *mut PyObject) -> *mut PyObject;
    /// `PyObject *PyDict_New(void)` (the attached bridge's fork hooks).
    #[cfg_attr(not(memshim_bridge), allow(dead_code))]
    dict_new: "PyDict_New" => fn() -> *mut PyObject;
    /// `int PyDict_SetItemString(PyObject *, const char *, PyObject *)`.
    #[cfg_attr(not(memshim_bridge), allow(dead_code))]
    dict_set_item_string: "PyDict_SetItemString" => fn(*mut PyObject, *const c_char, *mut PyObject) -> c_int;
    /// `Py_ssize_t PyGC_Collect(void)`: a full collection (no-op if disabled).
    gc_collect: "PyGC_Collect" => fn() -> isize;
    /// `PyInterpreterState *PyInterpreterState_Main(void)`.
    interp_main: "PyInterpreterState_Main" => fn() -> *mut c_void;
    /// `PyThreadState *PyInterpreterState_ThreadHead(PyInterpreterState *)`.
    interp_thread_head: "PyInterpreterState_ThreadHead" => fn(*mut c_void) -> *mut c_void;
    /// `PyThreadState *PyThreadState_Next(PyThreadState *)`.
    thread_next: "PyThreadState_Next" => fn(*mut c_void) -> *mut c_void;
    /// `PyThreadState *PyEval_SaveThread(void)`: releases the GIL.
    save_thread: "PyEval_SaveThread" => fn() -> *mut c_void;
    /// `void PyEval_RestoreThread(PyThreadState *)`: takes it back.
    restore_thread: "PyEval_RestoreThread" => fn(*mut c_void) -> ();
    /// `PyThreadState *PyThreadState_New(PyInterpreterState *)`: callable
    /// without the GIL; takes the runtime's thread-list lock briefly.
    thread_state_new: "PyThreadState_New" => fn(*mut c_void) -> *mut c_void;
    /// `void PyThreadState_Clear(PyThreadState *)`: GIL held.
    thread_state_clear: "PyThreadState_Clear" => fn(*mut c_void) -> ();
    /// `void PyThreadState_DeleteCurrent(void)`: deletes the current thread
    /// state and releases the GIL.
    thread_state_delete_current: "PyThreadState_DeleteCurrent" => fn() -> ();
    /// `unsigned long PyThread_get_thread_ident(void)`: the key of
    /// `threading._active` for the calling thread.
    thread_ident: "PyThread_get_thread_ident" => fn() -> core::ffi::c_ulong;
    /// `PyObject *PyLong_FromUnsignedLong(unsigned long)`: new.
    long_from_ulong: "PyLong_FromUnsignedLong" => fn(core::ffi::c_ulong) -> *mut PyObject;
    /// `int PyObject_IsInstance(PyObject *, PyObject *cls)`: -1 on error.
    is_instance: "PyObject_IsInstance" => fn(*mut PyObject, *mut PyObject) -> c_int;
    /// `int PyErr_GivenExceptionMatches(PyObject *given, PyObject *exc)`.
    given_exception_matches: "PyErr_GivenExceptionMatches" => fn(*mut PyObject, *mut PyObject) -> c_int;
    /// `int Py_AtExit(void (*)(void))`: a C function `Py_FinalizeEx` calls
    /// last, once the interpreter is gone (at most 32 per runtime; each is
    /// called once and dropped).
    py_at_exit: "Py_AtExit" => fn(AtExitFn) -> c_int;
    }
    optional {
        /// `int Py_IsFinalizing(void)` (3.13) or `_Py_IsFinalizing` (3.8-3.12):
        /// an atomic read, callable without the GIL.
        is_finalizing: ["Py_IsFinalizing", "_Py_IsFinalizing"] => fn() -> c_int;
        /// `int PyGC_IsEnabled(void)` (3.10+).
        gc_is_enabled: ["PyGC_IsEnabled"] => fn() -> c_int;
        /// `int PyGC_Enable(void)` (3.10+): returns the previous state.
        gc_enable: ["PyGC_Enable"] => fn() -> c_int;
        /// `int PyGC_Disable(void)` (3.10+): returns the previous state.
        gc_disable: ["PyGC_Disable"] => fn() -> c_int;
        /// `int _PyObject_DebugMallocStats(FILE *)`: what
        /// `sys._debugmallocstats()` prints, to any stream; 0 if pymalloc is
        /// not in use.
        debug_malloc_stats: ["_PyObject_DebugMallocStats"] => fn(*mut libc::FILE) -> c_int;
        /// `int Py_AddPendingCall(int (*)(void *), void *)`: schedules a call
        /// on the main interpreter's main thread at its next check between
        /// bytecodes; -1 when the queue is full. Public in every CPython,
        /// listed as optional so that its absence costs only the deferral
        /// (python/at_fork.rs).
        #[cfg_attr(not(memshim_bridge), allow(dead_code))]
        add_pending_call: ["Py_AddPendingCall"] => fn(PendingFn, *mut c_void) -> c_int;
        /// `PyFrameObject *PyEval_GetFrame(void)`: the current thread's
        /// innermost frame, borrowed (NULL: none); GIL held. Public in every
        /// CPython; the bridge compares it (python/at_fork.rs).
        #[cfg_attr(not(memshim_bridge), allow(dead_code))]
        eval_get_frame: ["PyEval_GetFrame"] => fn() -> *mut c_void;
        /// `PyInterpreterView *PyInterpreterView_FromMain(void)` (3.15, PEP
        /// 788): NULL once the main interpreter is gone (or before it
        /// exists); callable without a thread state.
        view_from_main: ["PyInterpreterView_FromMain"] => fn() -> *mut c_void;
        /// `void PyInterpreterView_Close(PyInterpreterView *)` (3.15).
        view_close: ["PyInterpreterView_Close"] => fn(*mut c_void) -> ();
        /// `PyInterpreterGuard *PyInterpreterGuard_FromView(PyInterpreterView *)`
        /// (3.15): NULL once finalization has begun; while the guard is
        /// held, finalization waits for it. No thread state needed.
        guard_from_view: ["PyInterpreterGuard_FromView"] => fn(*mut c_void) -> *mut c_void;
        /// `void PyInterpreterGuard_Close(PyInterpreterGuard *)` (3.15).
        guard_close: ["PyInterpreterGuard_Close"] => fn(*mut c_void) -> ();
    }
}

fn sym(name_nul: &str) -> *mut c_void {
    match core::ffi::CStr::from_bytes_with_nul(name_nul.as_bytes()) {
        Ok(name) => crate::os::dl::in_global_scope(name),
        Err(_) => core::ptr::null_mut(),
    }
}

/// The resolved API: a leaked `Box<Api>` (null before the first
/// resolution). Written by the shim's thread only; a set that is replaced
/// stays allocated, so a reference handed out earlier never dangles.
static API: AtomicPtr<Api> = AtomicPtr::new(core::ptr::null_mut());
/// How many times the API was resolved again for another libpython
/// ([`library`]).
static LIBRARY: core::sync::atomic::AtomicU32 = core::sync::atomic::AtomicU32::new(0);

/// Which libpython the API belongs to: a number that changes when the
/// process unloaded the one resolved before and loaded another (the exit
/// gate starts afresh with it).
pub fn library() -> u32 {
    LIBRARY.load(Acquire)
}

/// Address of `_Py_NoneStruct` (`None`), a data symbol.
static NONE: AtomicUsize = AtomicUsize::new(0);
/// Address of the variable `PyExc_Exception` (a `PyObject *`), a data symbol.
static EXC_EXCEPTION: AtomicUsize = AtomicUsize::new(0);

/// The interpreter's API, resolving it if not done yet or if the library
/// that held it has gone (module comment). `None`: no CPython in the global
/// scope. Call on the shim's thread only (see module comment); a job thread
/// reads [`resolved`].
pub fn api() -> Option<&'static Api> {
    let here = sym("Py_GetVersion\0");
    if here.is_null() {
        // No interpreter (any more): a later one is resolved afresh.
        return None;
    }
    if let Some(a) = resolved()
        && a.get_version as usize == here as usize
    {
        return Some(a);
    }
    let a = Api::resolve()?;
    NONE.store(sym("_Py_NoneStruct\0") as usize, Release);
    EXC_EXCEPTION.store(sym("PyExc_Exception\0") as usize, Release);
    // Leaked on purpose: see `API`. A process resolves once, or once per
    // libpython it loads.
    let p = Box::into_raw(Box::new(a));
    if !API.swap(p, AcqRel).is_null() {
        // Another libpython: a new runtime, with nothing of ours in it.
        LIBRARY.fetch_add(1, AcqRel);
    }
    // SAFETY: just stored, never freed.
    Some(unsafe { &*p })
}

/// The version of a CPython in the global scope whose API did not resolve
/// (`api()` is `None` while [`present`]): an older one (2.7, 3.6) lacks
/// functions the bridge needs. "unknown" if even `Py_GetVersion` is missing.
pub fn unresolved_version() -> String {
    version_text()
        .and_then(|t| t.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// What `get` (`Py_GetVersion`) returns, up to the first space.
fn version_of(get: unsafe extern "C" fn() -> *const c_char) -> String {
    // `Py_GetVersion` is callable at any time, before `Py_Initialize` too.
    // CPython 3.11 and older rewrite its static buffer with the same text
    // on every call: a host thread calling it at the same moment changes
    // no byte.
    // SAFETY: a NUL-terminated static buffer, as above.
    let full = unsafe { core::ffi::CStr::from_ptr(get()) };
    let s = full.to_string_lossy();
    s.split_whitespace().next().unwrap_or("unknown").to_owned()
}

/// Whether `Py_IsInitialized` is in the global scope: a CPython is linked
/// in or was loaded `RTLD_GLOBAL`.
pub fn present() -> bool {
    !sym("Py_IsInitialized\0").is_null()
}

/// The API as last resolved. For the job thread (`job.rs`) and the exit
/// hooks (`gate.rs`), which run only after the shim's thread resolved it.
pub fn resolved() -> Option<&'static Api> {
    let p = API.load(Acquire);
    // SAFETY: null, or a leaked Box that is never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// Whether the interpreter in the global scope is a free-threaded build:
/// `Py_GetVersion()` says so ("... free-threading build ..."), or it exports
/// the reference-count merge only such builds have. Read before anything
/// else of CPython's is called (`version.rs` refuses such builds).
pub fn free_threaded(api: &Api) -> bool {
    // SAFETY: `Py_GetVersion` returns a static NUL-terminated string.
    let full = unsafe { core::ffi::CStr::from_ptr((api.get_version)()) };
    free_threaded_text(&full.to_string_lossy())
}

/// [`free_threaded`], from `Py_GetVersion()`'s whole text `full`.
pub fn free_threaded_text(full: &str) -> bool {
    super::version::text_says_free_threaded(full) || !sym("_Py_MergeZeroLocalRefcount\0").is_null()
}

/// `Py_GetVersion()`'s whole text, if a CPython is in the global scope.
pub fn version_text() -> Option<String> {
    let f = sym("Py_GetVersion\0");
    if f.is_null() {
        return None;
    }
    // SAFETY: `Py_GetVersion` is `const char *(void)` in every CPython
    // since 2.0, and returns a static NUL-terminated string (see
    // `version_of` on its rewrites).
    let full = unsafe {
        let get = core::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> *const c_char>(f);
        core::ffi::CStr::from_ptr(get())
    };
    Some(full.to_string_lossy().into_owned())
}

impl Api {
    /// `Py_IsInitialized() && !Py_IsFinalizing()`. Callable without the GIL.
    /// `Py_FinalizeEx` marks the runtime finalizing, then clears
    /// "initialized" (both once the atexit functions have run), and then
    /// tears the modules down: not initialised and finalizing is shutting
    /// down, not yet to start. "Initialized" is read first, so a reader
    /// between the two writes sees it still set. Finalizing stays set after
    /// `Py_FinalizeEx` has returned, until a new `Py_Initialize`; by then
    /// the main interpreter is gone, which is "not initialised" again.
    pub fn usable(&self) -> Result<(), memshim_proto::PythonUnavailable> {
        use memshim_proto::PythonUnavailable as U;
        // SAFETY: plain reads of the runtime's state, documented callable
        // at any time, without the GIL or a thread state
        // (`PyInterpreterState_Main` reads `_PyRuntime.interpreters.main`).
        unsafe {
            let initialized = (self.is_initialized)() != 0;
            if self.is_finalizing.is_some_and(|f| f() != 0) {
                if (self.interp_main)().is_null() {
                    return Err(U::NotInitialized);
                }
                return Err(U::Finalizing);
            }
            if !initialized {
                return Err(U::NotInitialized);
            }
        }
        Ok(())
    }

    /// `Py_GetVersion()` up to the first space, e.g. "3.11.7".
    pub fn version(&self) -> String {
        version_of(self.get_version)
    }

    /// Address of `None` (null if the symbol is missing).
    pub fn none(&self) -> *mut PyObject {
        NONE.load(Acquire) as *mut PyObject
    }

    /// The class `Exception` (null if the symbol is missing).
    pub fn exception_class(&self) -> *mut PyObject {
        let var = EXC_EXCEPTION.load(Acquire) as *const *mut PyObject;
        if var.is_null() {
            return core::ptr::null_mut();
        }
        // SAFETY: `var` is the address of CPython's `PyExc_Exception`
        // variable, set once at start-up and never changed.
        unsafe { *var }
    }
}
