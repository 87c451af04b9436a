//! The `MEMSHIM_*` settings: one table, parsed once, without allocating.
//!
//! # When settings are read
//!
//! jemalloc initialises itself on the first allocation of the process, which
//! happens inside the dynamic loader or another library's constructor, long
//! before our own constructor runs. During that initialisation it calls
//! `secure_getenv("_RJEM_MALLOC_CONF")` exactly once. `build.rs` links the
//! library with `--wrap=secure_getenv`, so that call lands in
//! [`wrap_secure_getenv`], which parses every `MEMSHIM_*` variable
//! ([`load`]) and hands jemalloc one composed configuration string:
//!
//! ```text
//! memshim defaults , MALLOC_CONF , _RJEM_MALLOC_CONF , MEMSHIM_* knobs , MEMSHIM_MALLOC_CONF
//! ```
//!
//! jemalloc applies pairs left to right, so later sources win. The settings
//! are thus in force before `main`, and the allocation path never looks at
//! them. The constructor calls [`load`] again (a no-op if jemalloc already
//! did) for processes where jemalloc was never initialised.
//!
//! # Bad values
//!
//! A bad value prints exactly one `memshim: warning:` line naming the
//! variable and the default used instead. Nothing here aborts.

use crate::log;
use crate::sys::{self, StackBuf};
use core::cell::UnsafeCell;
use core::ffi::{CStr, c_char};
use core::fmt::Write;
use core::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU32, Ordering::*};

/// One row of the settings table. `docs/configuration.md` has one section
/// per row, and a test checks that the two agree.
pub struct Setting {
    /// Environment variable name.
    pub name: &'static str,
    /// The default, as the docs print it.
    pub default: &'static str,
    /// One line of documentation.
    pub doc: &'static str,
}

/// Every variable the shim or `memshim-ctl` reads. Keep in sync with
/// `docs/configuration.md` (a unit test enforces it).
pub const TABLE: &[Setting] = &[
    Setting {
        name: "MEMSHIM_DIRTY_DECAY_MS",
        default: "1000",
        doc: "milliseconds until freed (dirty) pages are returned to the OS; -1 = never",
    },
    Setting {
        name: "MEMSHIM_MUZZY_DECAY_MS",
        default: "0",
        doc: "milliseconds that MADV_FREE'd (muzzy) pages are kept before MADV_DONTNEED; -1 = never",
    },
    Setting {
        name: "MEMSHIM_NARENAS",
        default: "auto",
        doc: "number of jemalloc arenas; auto = 4 per CPU the cgroup quota allows",
    },
    Setting {
        name: "MEMSHIM_CONTROL",
        default: "auto",
        doc: "auto: background purging and the control socket start with the process's second thread; on: at start-up; off: never",
    },
    Setting {
        name: "MEMSHIM_SOCKET_DIR",
        default: "/tmp/memshim-<uid>",
        doc: "directory of the per-process control sockets",
    },
    Setting {
        name: "MEMSHIM_CLEAR_DEEPBIND",
        default: "1",
        doc: "strip RTLD_DEEPBIND from dlopen() so such libraries use the shim's malloc too",
    },
    Setting {
        name: "MEMSHIM_MALLOC_CONF",
        default: "(empty)",
        doc: "raw jemalloc options, applied last, over everything else",
    },
    Setting {
        name: "MEMSHIM_VERBOSE",
        default: "0",
        doc: "print the effective settings once at start-up",
    },
    Setting {
        name: "MEMSHIM_LIB",
        default: "(next to memshim-ctl)",
        doc: "memshim-ctl only: path of libmemshim.so for `memshim-ctl run`",
    },
];

/// When the shim may start its thread (see docs/design.md, "Threads").
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum Control {
    /// Start with the process's own second thread; stop when it is alone again.
    Auto = 0,
    /// Start in the constructor and never stop.
    On = 1,
    /// Never start a thread.
    Off = 2,
}

/// Built-in defaults (also the `default` column of [`TABLE`]).
pub const DEFAULT_DIRTY_DECAY_MS: i64 = 1000;
/// Built-in default for muzzy decay: 0 means decayed pages go straight to
/// MADV_DONTNEED, so RSS (and the cgroup counter) really drops.
pub const DEFAULT_MUZZY_DECAY_MS: i64 = 0;
/// Largest decay accepted (about 31 years); jemalloc's own bound is larger.
const MAX_DECAY_MS: i64 = 1_000_000_000_000;
/// Largest arena count accepted: jemalloc 5.3 reduces anything above 4094
/// (its arena limit, MALLOCX_ARENA_LIMIT 4095, less one) with a warning of
/// its own.
const MAX_NARENAS: u64 = 4094;
/// Longest raw jemalloc conf we pass on from one variable.
const MAX_RAW_CONF: usize = 2048;
/// Longest socket directory (sun_path is 108 bytes, the file name needs ~30).
pub const MAX_SOCKET_DIR: usize = 72;

static LOADED: AtomicBool = AtomicBool::new(false);
static DIRTY_DECAY_MS: AtomicI64 = AtomicI64::new(DEFAULT_DIRTY_DECAY_MS);
static DIRTY_SET: AtomicBool = AtomicBool::new(false);
static MUZZY_DECAY_MS: AtomicI64 = AtomicI64::new(DEFAULT_MUZZY_DECAY_MS);
static MUZZY_SET: AtomicBool = AtomicBool::new(false);
static NARENAS: AtomicU32 = AtomicU32::new(0); // 0 = auto
static CONTROL: AtomicU8 = AtomicU8::new(Control::Auto as u8);
static CLEAR_DEEPBIND: AtomicBool = AtomicBool::new(true);
static VERBOSE: AtomicBool = AtomicBool::new(false);

/// A static byte buffer written once, during `load` (single-threaded: jemalloc
/// holds its init lock, or the constructor runs), and only read afterwards.
struct OnceBuf<const N: usize>(UnsafeCell<[u8; N]>, AtomicU32);
// SAFETY: written only before LOADED is published with Release, read after
// an Acquire load of LOADED.
unsafe impl<const N: usize> Sync for OnceBuf<N> {}

impl<const N: usize> OnceBuf<N> {
    const fn new() -> Self {
        OnceBuf(UnsafeCell::new([0; N]), AtomicU32::new(0))
    }
    /// # Safety
    /// Only during `load`, before `LOADED` is set.
    unsafe fn set(&self, bytes: &[u8]) {
        let n = bytes.len().min(N - 1);
        // SAFETY: caller guarantees exclusive access.
        let buf = unsafe { &mut *self.0.get() };
        buf[..n].copy_from_slice(&bytes[..n]);
        buf[n] = 0;
        self.1.store(n as u32, Release);
    }
    fn get(&self) -> &[u8] {
        let n = self.1.load(Acquire) as usize;
        // SAFETY: the first `n` bytes were written before `n` was published.
        unsafe { &(&*self.0.get())[..n] }
    }
    fn as_ptr(&self) -> *const c_char {
        self.0.get().cast()
    }
}

static SOCKET_DIR: OnceBuf<{ MAX_SOCKET_DIR + 1 }> = OnceBuf::new();
static JEMALLOC_CONF: OnceBuf<8192> = OnceBuf::new();

#[cfg(not(test))]
unsafe extern "C" {
    /// glibc's `secure_getenv`, as renamed by `--wrap` (see `build.rs`).
    fn __real_secure_getenv(name: *const c_char) -> *mut c_char;
}

/// Unit tests link without `--wrap`.
#[cfg(test)]
unsafe fn __real_secure_getenv(name: *const c_char) -> *mut c_char {
    // SAFETY: forwarding a C string.
    unsafe { libc::getenv(name) }
}

fn env(name: &CStr) -> Option<&'static [u8]> {
    // SAFETY: `name` is NUL-terminated. The returned pointer points into the
    // environment block, which lives for the whole process unless the
    // program edits it; we copy what we keep.
    let p = unsafe { __real_secure_getenv(name.as_ptr()) };
    if p.is_null() {
        None
    } else {
        // SAFETY: getenv returns a NUL-terminated string.
        Some(unsafe { CStr::from_ptr(p) }.to_bytes())
    }
}

fn show(v: &[u8]) -> &str {
    core::str::from_utf8(v).unwrap_or("(not UTF-8)")
}

fn parse_bool(v: &[u8]) -> Option<bool> {
    match v.to_ascii_lowercase_stack().as_slice() {
        b"1" | b"true" | b"yes" | b"on" => Some(true),
        b"0" | b"false" | b"no" | b"off" => Some(false),
        _ => None,
    }
}

/// Lower-casing into a small stack array (values we compare are short).
trait LowerStack {
    fn to_ascii_lowercase_stack(&self) -> StackVec;
}
struct StackVec([u8; 16], usize);
impl StackVec {
    fn as_slice(&self) -> &[u8] {
        &self.0[..self.1]
    }
}
impl LowerStack for [u8] {
    fn to_ascii_lowercase_stack(&self) -> StackVec {
        let mut out = StackVec([0; 16], 0);
        if self.len() > 16 {
            // Too long to be a keyword; leave it empty so nothing matches.
            return out;
        }
        for (i, b) in self.iter().enumerate() {
            out.0[i] = b.to_ascii_lowercase();
        }
        out.1 = self.len();
        out
    }
}

/// Parses a decay value: whole milliseconds, or -1 for "never".
pub fn parse_decay(v: &[u8]) -> Option<i64> {
    match sys::parse_i64(v) {
        Some(n) if n == -1 || (0..=MAX_DECAY_MS).contains(&n) => Some(n),
        _ => None,
    }
}

/// Parses `MEMSHIM_NARENAS`: `auto` (0) or 1..=4094.
pub fn parse_narenas(v: &[u8]) -> Option<u32> {
    if v.to_ascii_lowercase_stack().as_slice() == b"auto" {
        return Some(0);
    }
    match sys::parse_u64(v) {
        Some(n) if (1..=MAX_NARENAS).contains(&n) => Some(n as u32),
        _ => None,
    }
}

/// Parses `MEMSHIM_CONTROL`.
pub fn parse_control(v: &[u8]) -> Option<Control> {
    match v.to_ascii_lowercase_stack().as_slice() {
        b"auto" => Some(Control::Auto),
        b"on" | b"1" | b"true" | b"yes" => Some(Control::On),
        b"off" | b"0" | b"false" | b"no" => Some(Control::Off),
        _ => None,
    }
}

/// Checks a socket directory: absolute, short enough for `sun_path`, no NUL.
pub fn valid_socket_dir(v: &[u8]) -> bool {
    v.first() == Some(&b'/') && v.len() <= MAX_SOCKET_DIR && !v.contains(&0)
}

/// Raw jemalloc conf: printable ASCII without spaces, bounded length, and
/// the shape `key:value(,key:value)*` with keys of `[A-Za-z0-9_]` (empty is
/// fine). The shape matters: jemalloc stops parsing at a malformed spot
/// (`junk`, `a:1,,b:2`, a trailing comma), which would silently drop every
/// setting composed after it (our knobs, `MEMSHIM_MALLOC_CONF`), and it
/// reports such strings twice. jemalloc itself validates each key and value
/// of a well-formed string (and we relay its message).
pub fn valid_raw_conf(v: &[u8]) -> bool {
    if v.len() > MAX_RAW_CONF || !v.iter().all(|b| b.is_ascii_graphic()) {
        return false;
    }
    v.is_empty()
        || v.split(|&b| b == b',')
            .all(|pair| match pair.iter().position(|&b| b == b':') {
                Some(k) if k > 0 => pair[..k]
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || *b == b'_'),
                _ => false,
            })
}

fn bad(name: &str, value: &[u8], expected: &str, default: &str) {
    // Quote at most this much of the value, so a huge one cannot push the
    // default off the end of the (bounded) line.
    const SHOW_MAX: usize = 80;
    let (shown, more) = if value.len() > SHOW_MAX {
        (&value[..SHOW_MAX], "...")
    } else {
        (value, "")
    };
    log::warning(format_args!(
        "{name}=\"{}{more}\" is not valid ({expected}); using the default {default}",
        show(shown)
    ));
}

/// Parses every `MEMSHIM_*` variable once per process. Called from jemalloc's
/// initialisation (through [`wrap_secure_getenv`]) and from the constructor;
/// whichever comes first does the work, in a single-threaded context.
pub fn load() {
    if LOADED.load(Acquire) {
        return;
    }
    if let Some(v) = env(c"MEMSHIM_DIRTY_DECAY_MS") {
        match parse_decay(v) {
            Some(n) => {
                DIRTY_DECAY_MS.store(n, Relaxed);
                DIRTY_SET.store(true, Relaxed);
            }
            None => bad(
                "MEMSHIM_DIRTY_DECAY_MS",
                v,
                "milliseconds, or -1 for never",
                "1000",
            ),
        }
    }
    if let Some(v) = env(c"MEMSHIM_MUZZY_DECAY_MS") {
        match parse_decay(v) {
            Some(n) => {
                MUZZY_DECAY_MS.store(n, Relaxed);
                MUZZY_SET.store(true, Relaxed);
            }
            None => bad(
                "MEMSHIM_MUZZY_DECAY_MS",
                v,
                "milliseconds, or -1 for never",
                "0",
            ),
        }
    }
    if let Some(v) = env(c"MEMSHIM_NARENAS") {
        match parse_narenas(v) {
            Some(n) => NARENAS.store(n, Relaxed),
            None => bad(
                "MEMSHIM_NARENAS",
                v,
                "auto, or a count from 1 to 4094",
                "auto",
            ),
        }
    }
    if let Some(v) = env(c"MEMSHIM_CONTROL") {
        match parse_control(v) {
            Some(c) => CONTROL.store(c as u8, Relaxed),
            None => bad("MEMSHIM_CONTROL", v, "auto, on or off", "auto"),
        }
    }
    if let Some(v) = env(c"MEMSHIM_CLEAR_DEEPBIND") {
        match parse_bool(v) {
            Some(b) => CLEAR_DEEPBIND.store(b, Relaxed),
            None => bad(
                "MEMSHIM_CLEAR_DEEPBIND",
                v,
                "a boolean: 1/0, true/false, yes/no, on/off",
                "1",
            ),
        }
    }
    if let Some(v) = env(c"MEMSHIM_VERBOSE") {
        match parse_bool(v) {
            Some(b) => VERBOSE.store(b, Relaxed),
            None => bad(
                "MEMSHIM_VERBOSE",
                v,
                "a boolean: 1/0, true/false, yes/no, on/off",
                "0",
            ),
        }
    }
    if let Some(v) = env(c"MEMSHIM_SOCKET_DIR") {
        if valid_socket_dir(v) {
            // SAFETY: single-threaded, before LOADED is published.
            unsafe { SOCKET_DIR.set(v) };
        } else {
            bad(
                "MEMSHIM_SOCKET_DIR",
                v,
                "an absolute path of at most 72 bytes",
                "/tmp/memshim-<uid>",
            );
        }
    }
    let raw = env(c"MEMSHIM_MALLOC_CONF").filter(|v| {
        let ok = valid_raw_conf(v);
        if !ok {
            bad(
                "MEMSHIM_MALLOC_CONF",
                v,
                "jemalloc options like key:value,key:value, at most 2048 printable characters",
                "(empty)",
            );
        }
        ok
    });
    compose_conf(raw);
    LOADED.store(true, Release);
}

/// Builds the string jemalloc parses (see the module docs for the order).
fn compose_conf(memshim_raw: Option<&[u8]>) {
    let mut s = StackBuf::<8192>::new();
    let sep = |s: &mut StackBuf<8192>| {
        if !s.as_bytes().is_empty() && s.as_bytes().last() != Some(&b',') {
            s.push(b",");
        }
    };
    // 1. memshim defaults. `oversize_threshold:0` turns off jemalloc's
    //    dedicated arena for allocations >= 8 MiB, which purges them
    //    immediately and makes tensor-sized buffers re-fault on every reuse;
    //    with it off, large buffers follow the same decay as everything else.
    let _ = write!(
        s,
        "dirty_decay_ms:{DEFAULT_DIRTY_DECAY_MS},muzzy_decay_ms:{DEFAULT_MUZZY_DECAY_MS},oversize_threshold:0"
    );
    if let Some(n) = auto_narenas() {
        let _ = write!(s, ",narenas:{n}");
    }
    // 2. Configuration written for a stock jemalloc.
    for name in [c"MALLOC_CONF", c"_RJEM_MALLOC_CONF"] {
        if let Some(v) = env(name).filter(|v| !v.is_empty()) {
            if valid_raw_conf(v) {
                sep(&mut s);
                s.push(v);
            } else {
                bad(
                    core::str::from_utf8(name.to_bytes()).unwrap_or("MALLOC_CONF"),
                    v,
                    "jemalloc options like key:value,key:value, at most 2048 printable characters",
                    "(ignored)",
                );
            }
        }
    }
    // 3. Our own knobs, only where the user set them.
    if DIRTY_SET.load(Relaxed) {
        sep(&mut s);
        let _ = write!(s, "dirty_decay_ms:{}", DIRTY_DECAY_MS.load(Relaxed));
    }
    if MUZZY_SET.load(Relaxed) {
        sep(&mut s);
        let _ = write!(s, "muzzy_decay_ms:{}", MUZZY_DECAY_MS.load(Relaxed));
    }
    let n = NARENAS.load(Relaxed);
    if n != 0 {
        sep(&mut s);
        let _ = write!(s, "narenas:{n}");
    }
    // 4. Expert override.
    if let Some(v) = memshim_raw.filter(|v| !v.is_empty()) {
        sep(&mut s);
        s.push(v);
    }
    // SAFETY: single-threaded, before LOADED is published.
    unsafe { JEMALLOC_CONF.set(s.as_bytes()) };
}

/// CPUs the process may really use: the affinity mask, capped by a cgroup CPU
/// quota (`cpu.max` in v2, `cpu.cfs_quota_us` in v1). Containers limited by
/// quota still see every host CPU in their affinity mask, and jemalloc would
/// create 4 arenas per host CPU (hazard 47).
pub fn effective_cpus() -> (u32, Option<u32>) {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it.
    let affinity = unsafe {
        let mut set: libc::cpu_set_t = core::mem::zeroed();
        if libc::sched_getaffinity(0, core::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            libc::CPU_COUNT(&set).max(1) as u32
        } else {
            1
        }
    };
    (affinity, cgroup_quota_cpus())
}

fn cgroup_quota_cpus() -> Option<u32> {
    let mut buf = [0u8; 128];
    // cgroup v2: "max 100000" or "<quota> <period>".
    if let Some(n) = sys::read_file(c"/sys/fs/cgroup/cpu.max", &mut buf) {
        let mut it = buf[..n]
            .split(|b| b.is_ascii_whitespace())
            .filter(|f| !f.is_empty());
        let quota = sys::parse_u64(it.next()?)?;
        let period = sys::parse_u64(it.next()?)?;
        return quota_to_cpus(quota, period);
    }
    // cgroup v1.
    let n = sys::read_file(c"/sys/fs/cgroup/cpu/cpu.cfs_quota_us", &mut buf)?;
    let quota = sys::parse_i64(buf[..n].trim_ascii())?;
    let n = sys::read_file(c"/sys/fs/cgroup/cpu/cpu.cfs_period_us", &mut buf)?;
    let period = sys::parse_u64(buf[..n].trim_ascii())?;
    quota_to_cpus(u64::try_from(quota).ok()?, period)
}

fn quota_to_cpus(quota: u64, period: u64) -> Option<u32> {
    if period == 0 || quota == 0 {
        return None;
    }
    Some(quota.div_ceil(period).clamp(1, 1 << 16) as u32)
}

/// `narenas` for the defaults: only when a quota is tighter than the
/// affinity mask (otherwise jemalloc's own default is already right).
fn auto_narenas() -> Option<u32> {
    let (affinity, quota) = effective_cpus();
    let quota = quota?;
    (quota < affinity).then(|| (4 * quota).min(MAX_NARENAS as u32))
}

/// Entry point of `--wrap=secure_getenv`: jemalloc asks for
/// `_RJEM_MALLOC_CONF` during its initialisation; everything else passes
/// through to glibc. Reached through a hidden trampoline (`dlopen.rs` style)
/// so the library exports no extra symbol.
///
/// # Safety
/// `name` must be NUL-terminated (it is what glibc's `secure_getenv` takes).
pub unsafe extern "C" fn wrap_secure_getenv(name: *const c_char) -> *mut c_char {
    // SAFETY: caller passes a C string.
    let key = unsafe { CStr::from_ptr(name) };
    if key.to_bytes() == b"_RJEM_MALLOC_CONF" {
        // Route jemalloc's own complaints through our warning format.
        // SAFETY: jemalloc reads this pointer only when it prints; setting it
        // during its initialisation, before any message, is the documented use.
        unsafe { tikv_jemalloc_sys::malloc_message = Some(log::jemalloc_message) };
        load();
        return JEMALLOC_CONF.as_ptr() as *mut c_char;
    }
    // SAFETY: forwarding the caller's argument unchanged.
    unsafe { __real_secure_getenv(name) }
}

#[cfg(not(test))]
core::arch::global_asm!(
    ".globl __wrap_secure_getenv",
    ".hidden __wrap_secure_getenv",
    ".type __wrap_secure_getenv,@function",
    "__wrap_secure_getenv:",
    #[cfg(target_arch = "x86_64")]
    "jmp {f}",
    #[cfg(target_arch = "aarch64")]
    "b {f}",
    ".size __wrap_secure_getenv, . - __wrap_secure_getenv",
    f = sym wrap_secure_getenv,
);

/// Effective dirty decay as configured through `MEMSHIM_*` (jemalloc's
/// `opt.dirty_decay_ms` is the final word; see `jemalloc::opt_decay`).
pub fn dirty_decay_ms() -> i64 {
    DIRTY_DECAY_MS.load(Relaxed)
}
/// `MEMSHIM_CONTROL`.
pub fn control() -> Control {
    match CONTROL.load(Relaxed) {
        1 => Control::On,
        2 => Control::Off,
        _ => Control::Auto,
    }
}
/// `MEMSHIM_CLEAR_DEEPBIND`.
pub fn clear_deepbind() -> bool {
    CLEAR_DEEPBIND.load(Relaxed)
}
/// `MEMSHIM_VERBOSE`.
pub fn verbose() -> bool {
    VERBOSE.load(Relaxed)
}
/// `MEMSHIM_SOCKET_DIR` if set and valid.
pub fn socket_dir() -> Option<&'static [u8]> {
    let v = SOCKET_DIR.get();
    (!v.is_empty()).then_some(v)
}
/// The configuration string handed to jemalloc.
pub fn jemalloc_conf() -> &'static [u8] {
    JEMALLOC_CONF.get()
}

/// Warns once about `MEMSHIM_*` variables that are not in [`TABLE`] (typos).
/// Called from the constructor, where iterating `environ` is safe.
pub fn warn_unknown() {
    // SAFETY: `environ` is a NULL-terminated array of C strings.
    unsafe {
        let mut p = environ;
        if p.is_null() {
            return;
        }
        while !(*p).is_null() {
            let entry = CStr::from_ptr(*p).to_bytes();
            if let Some(rest) = entry.strip_prefix(b"MEMSHIM_") {
                let name_len = rest.iter().position(|&b| b == b'=').unwrap_or(rest.len());
                let name = &entry[..8 + name_len];
                if !TABLE.iter().any(|s| s.name.as_bytes() == name) {
                    log::warning(format_args!(
                        "{} is not a memshim setting and is ignored (see docs/configuration.md)",
                        show(name)
                    ));
                }
            }
            p = p.add(1);
        }
    }
}

unsafe extern "C" {
    static environ: *const *const c_char;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decay_values() {
        assert_eq!(parse_decay(b"-1"), Some(-1));
        assert_eq!(parse_decay(b"0"), Some(0));
        assert_eq!(parse_decay(b"10000"), Some(10000));
        assert_eq!(parse_decay(b"1000000000000"), Some(MAX_DECAY_MS));
        for bad in [
            &b""[..],
            b"-2",
            b"1e3",
            b"abc",
            b" 5",
            b"99999999999999999999",
            b"1000000000001",
        ] {
            assert_eq!(parse_decay(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn narenas_values() {
        assert_eq!(parse_narenas(b"auto"), Some(0));
        assert_eq!(parse_narenas(b"AUTO"), Some(0));
        assert_eq!(parse_narenas(b"1"), Some(1));
        assert_eq!(parse_narenas(b"4094"), Some(4094));
        for bad in [&b"0"[..], b"4095", b"4096", b"-1", b"", b"many"] {
            assert_eq!(parse_narenas(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn control_and_bool_values() {
        assert_eq!(parse_control(b"auto"), Some(Control::Auto));
        assert_eq!(parse_control(b"ON"), Some(Control::On));
        assert_eq!(parse_control(b"off"), Some(Control::Off));
        assert_eq!(parse_control(b"sometimes"), None);
        assert_eq!(parse_bool(b"Yes"), Some(true));
        assert_eq!(parse_bool(b"0"), Some(false));
        assert_eq!(parse_bool(b""), None);
        assert_eq!(parse_bool(b"2"), None);
        assert_eq!(parse_bool(b"a-very-long-value-indeed"), None);
    }

    #[test]
    fn socket_dir_and_raw_conf() {
        assert!(valid_socket_dir(b"/run/memshim"));
        assert!(!valid_socket_dir(b"relative/dir"));
        assert!(!valid_socket_dir(&[b'/'; 73]));
        assert!(valid_raw_conf(b"narenas:2,tcache_max:4096"));
        assert!(!valid_raw_conf(b"narenas: 2"));
        assert!(!valid_raw_conf(&[b'a'; 2049]));
        assert!(valid_raw_conf(b""));
        assert!(valid_raw_conf(b"prof_prefix:/tmp/x:y,narenas:"));
        for bad in [
            &b"junk"[..],
            b",",
            b"narenas:2,",
            b"a:1,,b:2",
            b":1",
            b"na-renas:1",
            b"narenas:2,junk",
        ] {
            assert!(!valid_raw_conf(bad), "{bad:?}");
        }
    }

    #[test]
    fn quota_rounds_up() {
        assert_eq!(quota_to_cpus(150_000, 100_000), Some(2));
        assert_eq!(quota_to_cpus(50_000, 100_000), Some(1));
        assert_eq!(quota_to_cpus(0, 100_000), None);
    }

    #[test]
    fn docs_list_every_setting() {
        let doc = include_str!("../../docs/configuration.md");
        for s in TABLE {
            assert!(
                doc.contains(&format!("### `{}`", s.name)),
                "docs/configuration.md lacks {}",
                s.name
            );
            assert!(
                doc.contains(&format!("*Default: `{}`*", s.default)),
                "docs lack default of {}",
                s.name
            );
        }
    }
}
