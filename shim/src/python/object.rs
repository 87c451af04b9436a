//! Owned references and small helpers over the C API, for code that holds
//! the GIL (the job thread, `job.rs`).
//!
//! Every failure inside Python comes back as `Err(text)` with the exception
//! fetched and cleared, so nothing is left set for the host's code.

use super::ffi::{Api, PyObject};
use core::ffi::CStr;

/// Proof that the calling thread holds the GIL, plus the API.
pub struct Py {
    api: &'static Api,
}

/// An owned (strong) reference; released on drop.
pub struct Obj<'p> {
    ptr: *mut PyObject,
    py: &'p Py,
}

impl Drop for Obj<'_> {
    fn drop(&mut self) {
        // SAFETY: `ptr` is a strong reference we own, and the GIL is held
        // (an `Obj` cannot outlive the `Py` it came from).
        unsafe { (self.py.api.dec_ref)(self.ptr) }
    }
}

impl Obj<'_> {
    /// The raw pointer (still owned by `self`).
    pub fn as_ptr(&self) -> *mut PyObject {
        self.ptr
    }
}

/// Result of a Python-level operation: the exception's text on failure.
pub type PyResult<T> = Result<T, String>;

impl Py {
    /// # Safety
    /// The calling thread must hold the GIL (or be attached, in a
    /// free-threaded build) for as long as the returned value lives.
    pub unsafe fn assume_attached(api: &'static Api) -> Py {
        Py { api }
    }

    /// The API.
    pub fn api(&self) -> &'static Api {
        self.api
    }

    fn own(&self, ptr: *mut PyObject) -> PyResult<Obj<'_>> {
        if ptr.is_null() {
            Err(self.take_error())
        } else {
            Ok(Obj { ptr, py: self })
        }
    }

    /// Takes ownership of a new reference (NULL: the pending exception).
    ///
    /// # Safety
    /// `ptr` is NULL or a strong reference the caller owns and gives up.
    pub unsafe fn adopt(&self, ptr: *mut PyObject) -> PyResult<Obj<'_>> {
        self.own(ptr)
    }

    /// A new reference to a borrowed pointer.
    fn own_borrowed(&self, ptr: *mut PyObject) -> Obj<'_> {
        // SAFETY: `ptr` is a live object (borrowed from a container that
        // keeps it alive while we hold the GIL).
        unsafe { (self.api.inc_ref)(ptr) };
        Obj { ptr, py: self }
    }

    /// `sys.modules[name]` if the program has imported it. Never imports.
    pub fn imported(&self, name: &CStr) -> Option<Obj<'_>> {
        // SAFETY: GIL held; both return borrowed references (or NULL without
        // an exception for a missing key).
        let m = unsafe {
            let modules = (self.api.import_get_module_dict)();
            if modules.is_null() {
                return None;
            }
            (self.api.dict_get_item_string)(modules, name.as_ptr())
        };
        (!m.is_null() && m != self.api.none()).then(|| self.own_borrowed(m))
    }

    /// `import name` of a module built into CPython (no Python code of its
    /// own runs); `sys.modules[name]` if the program imported it already.
    pub fn import(&self, name: &CStr) -> PyResult<Obj<'_>> {
        if let Some(m) = self.imported(name) {
            return Ok(m);
        }
        // SAFETY: GIL held; returns a new reference or NULL with an
        // exception (taken by `own`).
        self.own(unsafe {
            (self.api.import_module_level)(
                name.as_ptr(),
                core::ptr::null_mut(),
                core::ptr::null_mut(),
                core::ptr::null_mut(),
                0,
            )
        })
    }

    /// `sys.<name>` (borrowed from `sys`, returned as a new reference).
    pub fn sys_attr(&self, name: &CStr) -> Option<Obj<'_>> {
        // SAFETY: GIL held; borrowed result or NULL (no exception).
        let p = unsafe { (self.api.sys_get_object)(name.as_ptr()) };
        (!p.is_null()).then(|| self.own_borrowed(p))
    }

    /// `o.name`.
    pub fn attr<'p>(&'p self, o: &Obj<'_>, name: &CStr) -> PyResult<Obj<'p>> {
        // SAFETY: GIL held, live object, NUL-terminated name.
        self.own(unsafe { (self.api.get_attr_string)(o.ptr, name.as_ptr()) })
    }

    /// `o[key]` for a mapping.
    pub fn item<'p>(&'p self, o: &Obj<'_>, key: &CStr) -> PyResult<Obj<'p>> {
        // SAFETY: GIL held, live object, NUL-terminated key.
        self.own(unsafe { (self.api.mapping_get_item_string)(o.ptr, key.as_ptr()) })
    }

    /// `o[i]` for a sequence.
    pub fn index<'p>(&'p self, o: &Obj<'_>, i: isize) -> PyResult<Obj<'p>> {
        // SAFETY: GIL held, live object.
        self.own(unsafe { (self.api.sequence_get_item)(o.ptr, i) })
    }

    /// `len(o)` for a sequence.
    pub fn len(&self, o: &Obj<'_>) -> PyResult<usize> {
        // SAFETY: GIL held, live object.
        let n = unsafe { (self.api.sequence_size)(o.ptr) };
        if n < 0 {
            Err(self.take_error())
        } else {
            Ok(n as usize)
        }
    }

    /// `f(*args)`; args are borrowed.
    pub fn call<'p>(&'p self, f: &Obj<'_>, args: &[*mut PyObject]) -> PyResult<Obj<'p>> {
        // SAFETY: GIL held; PyTuple_SetItem steals, so each argument gets a
        // new reference first; the tuple is released by `Obj`.
        unsafe {
            let t = self.own((self.api.tuple_new)(args.len() as isize))?;
            for (i, &a) in args.iter().enumerate() {
                (self.api.inc_ref)(a);
                if (self.api.tuple_set_item)(t.ptr, i as isize, a) != 0 {
                    return Err(self.take_error());
                }
            }
            self.own((self.api.call)(f.ptr, t.ptr, core::ptr::null_mut()))
        }
    }

    /// `f(**kwargs)`, each keyword's value borrowed from the caller.
    #[cfg(memshim_bridge)]
    pub fn call_kw<'p>(
        &'p self,
        f: &Obj<'_>,
        kwargs: &[(&CStr, *mut PyObject)],
    ) -> PyResult<Obj<'p>> {
        // SAFETY: GIL held; PyDict_SetItemString takes its own references;
        // the empty tuple and the dict are released by `Obj`.
        unsafe {
            let t = self.own((self.api.tuple_new)(0))?;
            let d = self.own((self.api.dict_new)())?;
            for (k, v) in kwargs {
                if (self.api.dict_set_item_string)(d.ptr, k.as_ptr(), *v) != 0 {
                    return Err(self.take_error());
                }
            }
            self.own((self.api.call)(f.ptr, t.ptr, d.ptr))
        }
    }

    /// `o.name(*args)`.
    pub fn call_method<'p>(
        &'p self,
        o: &Obj<'_>,
        name: &CStr,
        args: &[*mut PyObject],
    ) -> PyResult<Obj<'p>> {
        let f = self.attr(o, name)?;
        self.call(&f, args)
    }

    /// A Python int.
    pub fn int(&self, v: i64) -> PyResult<Obj<'_>> {
        // SAFETY: GIL held.
        self.own(unsafe { (self.api.long_from_i64)(v) })
    }

    /// `int(o)` as u64 (negative values become 0).
    pub fn to_u64(&self, o: &Obj<'_>) -> PyResult<u64> {
        // SAFETY: GIL held, live object.
        let v = unsafe { (self.api.long_as_i64)(o.ptr) };
        // SAFETY: GIL held.
        if v == -1 && unsafe { !(self.api.err_occurred)().is_null() } {
            return Err(self.take_error());
        }
        Ok(v.max(0) as u64)
    }

    /// `bool(o)`.
    pub fn to_bool(&self, o: &Obj<'_>) -> PyResult<bool> {
        // SAFETY: GIL held, live object.
        match unsafe { (self.api.is_true)(o.ptr) } {
            r if r < 0 => Err(self.take_error()),
            r => Ok(r != 0),
        }
    }

    /// `str(o)`.
    pub fn to_string(&self, o: &Obj<'_>) -> PyResult<String> {
        self.to_string_max(o, usize::MAX)
    }

    /// `str(o)`, cut to at most `max` bytes at a character boundary (an
    /// exception's text can be arbitrarily long; only a prefix is copied).
    pub fn to_string_max(&self, o: &Obj<'_>, max: usize) -> PyResult<String> {
        // SAFETY: GIL held, live object.
        let s = self.own(unsafe { (self.api.str_)(o.ptr) })?;
        // SAFETY: `s` is a str; the UTF-8 buffer lives as long as `s`.
        let p = unsafe { (self.api.unicode_as_utf8)(s.ptr) };
        if p.is_null() {
            return Err(self.take_error());
        }
        // SAFETY: NUL-terminated, valid while `s` is alive (copied here).
        let bytes = unsafe { CStr::from_ptr(p) }.to_bytes();
        Ok(utf8_prefix(bytes, max))
    }

    /// A 3-sequence of ints, such as `gc.get_count()`.
    pub fn triple(&self, o: &Obj<'_>) -> PyResult<[u64; 3]> {
        let mut out = [0u64; 3];
        let n = self.len(o)?.min(3);
        for (i, slot) in out.iter_mut().enumerate().take(n) {
            *slot = self.to_u64(&self.index(o, i as isize)?)?;
        }
        Ok(out)
    }

    /// Fetches and clears the current exception as "Type: message", at most
    /// [`MAX_ERROR_TEXT`] bytes.
    ///
    /// Jobs run on the shim's own job thread (`job.rs`), where no code of
    /// the host's runs except what a job calls (finalizers' exceptions never
    /// reach it: CPython reports them as unraisable). So an exception here
    /// is never the host's; one that is not an `Exception`
    /// (`KeyboardInterrupt`, `SystemExit`, ...) is named as such, and ends the
    /// job like any other (the `?` of every caller).
    pub fn take_error(&self) -> String {
        let (mut t, mut v, mut tb) = (
            core::ptr::null_mut(),
            core::ptr::null_mut(),
            core::ptr::null_mut(),
        );
        // SAFETY: GIL held; out-pointers are locals; we then own the three
        // references (any may be NULL) and release them below.
        unsafe { (self.api.err_fetch)(&mut t, &mut v, &mut tb) };
        if t.is_null() {
            return "unknown error (no exception set)".to_owned();
        }
        let exception = self.api.exception_class();
        // SAFETY: GIL held; `t` is a live type object, `exception` a class
        // (or NULL, then not called).
        let ordinary =
            exception.is_null() || unsafe { (self.api.given_exception_matches)(t, exception) } != 0;
        let ty = Obj { ptr: t, py: self };
        let name = self
            .attr(&ty, c"__name__")
            .and_then(|n| self.to_string_max(&n, 200))
            .unwrap_or_else(|_| "Exception".to_owned());
        let msg = if v.is_null() {
            String::new()
        } else {
            let val = Obj { ptr: v, py: self };
            self.to_string_max(&val, MAX_ERROR_TEXT).unwrap_or_default()
        };
        if !tb.is_null() {
            drop(Obj { ptr: tb, py: self });
        }
        // A failure while formatting must not stay set either.
        // SAFETY: GIL held.
        unsafe {
            if !(self.api.err_occurred)().is_null() {
                let (mut a, mut b, mut c) = (
                    core::ptr::null_mut(),
                    core::ptr::null_mut(),
                    core::ptr::null_mut(),
                );
                (self.api.err_fetch)(&mut a, &mut b, &mut c);
                for p in [a, b, c] {
                    (self.api.dec_ref)(p);
                }
            }
        }
        let name = if ordinary {
            name
        } else {
            format!("interrupted by {name}")
        };
        let text = if msg.is_empty() {
            name
        } else {
            format!("{name}: {msg}")
        };
        utf8_prefix(text.as_bytes(), MAX_ERROR_TEXT)
    }
}

/// Longest exception text a job reports, in bytes.
pub const MAX_ERROR_TEXT: usize = 400;

/// The longest prefix of `bytes` of at most `max` bytes that ends at a
/// character boundary, as a `String` (invalid UTF-8 replaced). Never panics,
/// whatever `max` and wherever multi-byte characters fall.
pub fn utf8_prefix(bytes: &[u8], max: usize) -> String {
    let mut cut = bytes.len().min(max);
    // Back off to the start of a character: continuation bytes are 10xxxxxx.
    while cut > 0 && cut < bytes.len() && bytes[cut] & 0xC0 == 0x80 {
        cut -= 1;
    }
    String::from_utf8_lossy(&bytes[..cut]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::utf8_prefix;

    #[test]
    fn prefixes_end_at_character_boundaries() {
        let text = "é".repeat(300) + "日本語" + &"\u{1F600}".repeat(10);
        for max in 0..text.len() + 3 {
            let p = utf8_prefix(text.as_bytes(), max);
            assert!(p.len() <= max, "{max}");
            assert!(text.starts_with(&p), "{max}");
            assert!(p.len() + 4 > max.min(text.len()), "{max}: {}", p.len());
        }
        assert_eq!(utf8_prefix(b"abc", 2), "ab");
        assert_eq!(utf8_prefix(b"\xff\xfe", 10), "\u{FFFD}\u{FFFD}");
    }
}
