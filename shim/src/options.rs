//! The `MEMSHIM_*` settings: one table, parsed once, without allocating.
//!
//! Each row of [`TABLE`] holds a variable's name, its default as the docs
//! print it, one line of documentation, what a valid value is, and the
//! parser (with its limits) that fills the row's value. [`load`] walks the
//! table; adding a setting is adding a row, its value and an accessor
//! (docs/configuration.md gets a section, a unit test checks it does).
//!
//! # When settings are read
//!
//! jemalloc initialises itself on the first allocation of the process, which
//! happens inside the dynamic loader or another library's constructor, long
//! before our constructor runs. During that initialisation it calls
//! `secure_getenv("_RJEM_MALLOC_CONF")` exactly once; `build.rs` links the
//! library with `--wrap=secure_getenv`, so that call lands in
//! `exports::wrap_secure_getenv`, which calls [`load`] and hands jemalloc
//! one composed configuration string:
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
//! jemalloc holds its init lock meanwhile: everything here reads the
//! environment and the cgroup files with raw system calls (`os::env`,
//! `os::raw`), never with a libc function another preload could replace
//! with one that allocates.
//!
//! # Bad values
//!
//! A bad value prints exactly one `memshim: warning:` line naming the
//! variable and the default used instead. Nothing here aborts.

use crate::log;
use crate::os::{self, StackBuf};
use core::cell::UnsafeCell;
use core::ffi::c_char;
use core::fmt::Write;
use core::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering::*};
use memshim_proto::endpoint::{self, DECAY_NEVER, MAX_DECAY_MS};

/// One row of the settings table.
pub struct Setting {
    /// Environment variable name.
    pub name: &'static str,
    /// The default, as the docs print it.
    pub default: &'static str,
    /// One line of documentation.
    pub doc: &'static str,
    /// What a valid value is, for the warning.
    pub expect: &'static str,
    /// Where the value goes, and how it is parsed.
    pub value: Value,
}

/// A setting's value and its parser.
pub enum Value {
    /// A number (or a keyword mapped to one), parsed by the function.
    Int(&'static Int, fn(&[u8]) -> Option<i64>),
    /// Bytes, accepted by the function (copied as they are).
    Text(&'static Text, fn(&[u8]) -> bool),
    /// Read by `memshim-ctl`, not by the library.
    Cli,
}

/// A numeric setting: its default, its value, and whether it was set.
pub struct Int {
    value: AtomicI64,
    set: AtomicBool,
}

impl Int {
    const fn new(default: i64) -> Int {
        Int {
            value: AtomicI64::new(default),
            set: AtomicBool::new(false),
        }
    }
    fn get(&self) -> i64 {
        self.value.load(Relaxed)
    }
    /// Whether the environment set it (validly).
    fn is_set(&self) -> bool {
        self.set.load(Relaxed)
    }
}

/// A text setting: bytes written once, during [`load`] (single-threaded:
/// jemalloc holds its init lock, or the constructor runs), and only read
/// afterwards.
pub struct Text(UnsafeCell<[u8; TEXT_MAX + 1]>, AtomicU32);

/// Longest text value kept.
const TEXT_MAX: usize = 2048;

// SAFETY: written only before LOADED is published with Release, read after
// an Acquire load of LOADED (the accessors check it).
unsafe impl Sync for Text {}

impl Text {
    const fn new() -> Text {
        Text(UnsafeCell::new([0; TEXT_MAX + 1]), AtomicU32::new(0))
    }
    /// # Safety
    /// Only during `load`, before `LOADED` is set.
    unsafe fn set(&self, bytes: &[u8]) {
        let n = bytes.len().min(TEXT_MAX);
        // SAFETY: the caller guarantees exclusive access.
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
}

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

/// Where the shim's thread keeps its descriptors.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FdTable {
    /// A table of its own where the kernel allows it, else the application's.
    Auto,
    /// The application's table (the fallback), even where a table of its
    /// own is possible: for tests of the fallback.
    Shared,
}

/// What the shim's thread does when its memory cgroup is under pressure
/// (thread/pressure.rs).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum Pressure {
    /// Watch where a limit exists; purge on pressure.
    On = 1,
    /// Do not watch.
    Off = 0,
    /// As `On`, and run Python's garbage collector before purging.
    Gc = 2,
}

/// The decay defaults: freed pages go back within a second, and straight
/// to `MADV_DONTNEED` (so RSS and the cgroup counter really drop).
const DIRTY_DECAY_MS_DEFAULT: i64 = 1000;
const MUZZY_DECAY_MS_DEFAULT: i64 = 0;
/// The least unused CUDA cache the idle return acts on: below a quarter of
/// a GiB, emptying the cache saves less than the CUDA context itself costs
/// (about 250-500 MiB per device) and the next burst pays to refill it.
const CUDA_IDLE_MIN_MB_DEFAULT: i64 = 256;

static DIRTY_DECAY_MS: Int = Int::new(DIRTY_DECAY_MS_DEFAULT);
static MUZZY_DECAY_MS: Int = Int::new(MUZZY_DECAY_MS_DEFAULT);
static NARENAS: Int = Int::new(0); // 0 = auto
static CONTROL: Int = Int::new(Control::Auto as i64);
static CLEAR_DEEPBIND: Int = Int::new(1);
static VERBOSE: Int = Int::new(0);
static FD_TABLE: Int = Int::new(0); // 0 = auto, 1 = shared
static CUDA_IDLE_MS: Int = Int::new(0); // off
static CUDA_IDLE_MIN_MB: Int = Int::new(CUDA_IDLE_MIN_MB_DEFAULT);
static PRESSURE: Int = Int::new(Pressure::On as i64);
static PRESSURE_THRESHOLD: Int = Int::new(90);
static SOCKET_DIR: Text = Text::new();
static MALLOC_CONF: Text = Text::new();

const BOOL: &str = "a boolean: 1/0, true/false, yes/no, on/off";

/// Every variable the shim or `memshim-ctl` reads. `docs/configuration.md`
/// has one section per row (a unit test enforces it).
pub const TABLE: &[Setting] = &[
    Setting {
        name: "MEMSHIM_DIRTY_DECAY_MS",
        default: "1000",
        doc: "milliseconds until freed (dirty) pages are returned to the OS; -1 = never",
        expect: "milliseconds, or -1 for never",
        value: Value::Int(&DIRTY_DECAY_MS, parse_decay),
    },
    Setting {
        name: "MEMSHIM_MUZZY_DECAY_MS",
        default: "0",
        doc: "milliseconds that MADV_FREE'd (muzzy) pages are kept before MADV_DONTNEED; -1 = never",
        expect: "milliseconds, or -1 for never",
        value: Value::Int(&MUZZY_DECAY_MS, parse_decay),
    },
    Setting {
        name: "MEMSHIM_NARENAS",
        default: "auto",
        doc: "number of jemalloc arenas; auto = 4 per CPU the cgroup quota allows",
        expect: "auto, or a count from 1 to 4094",
        value: Value::Int(&NARENAS, parse_narenas),
    },
    Setting {
        name: "MEMSHIM_CONTROL",
        default: "auto",
        doc: "auto: background purging and the control socket start with the process's second thread; on: at start-up; off: never",
        expect: "auto, on or off",
        value: Value::Int(&CONTROL, parse_control),
    },
    Setting {
        name: "MEMSHIM_PRESSURE",
        default: "on",
        doc: "on: the shim's thread watches the memory cgroup's limit and pressure and purges at once when memory runs short; gc: also runs Python's gc first; off: no watching",
        expect: "on, off or gc",
        value: Value::Int(&PRESSURE, parse_pressure),
    },
    Setting {
        name: "MEMSHIM_PRESSURE_THRESHOLD",
        default: "90",
        doc: "percent of the cgroup's limit (v2: memory.high, else memory.max) at which the working set counts as pressure",
        expect: "a whole percentage from 10 to 99",
        value: Value::Int(&PRESSURE_THRESHOLD, parse_percent),
    },
    Setting {
        name: "MEMSHIM_SOCKET_DIR",
        default: "/tmp/memshim-<uid>",
        doc: "directory of the per-process control sockets",
        expect: "an absolute path of at most 72 bytes",
        value: Value::Text(&SOCKET_DIR, endpoint::valid_socket_dir),
    },
    Setting {
        name: "MEMSHIM_CLEAR_DEEPBIND",
        default: "1",
        doc: "strip RTLD_DEEPBIND from dlopen() so such libraries use the shim's malloc too",
        expect: BOOL,
        value: Value::Int(&CLEAR_DEEPBIND, parse_bool),
    },
    Setting {
        name: "MEMSHIM_MALLOC_CONF",
        default: "(empty)",
        doc: "raw jemalloc options, applied last, over everything else",
        expect: "jemalloc options like key:value,key:value, at most 2048 printable characters",
        value: Value::Text(&MALLOC_CONF, valid_raw_conf),
    },
    Setting {
        name: "MEMSHIM_VERBOSE",
        default: "0",
        doc: "print the effective settings once at start-up",
        expect: BOOL,
        value: Value::Int(&VERBOSE, parse_bool),
    },
    Setting {
        name: "MEMSHIM_FD_TABLE",
        default: "auto",
        doc: "auto: the shim's thread keeps its descriptors in a table of its own where the kernel allows it; shared: in the application's (the fallback, for tests)",
        expect: "auto or shared",
        value: Value::Int(&FD_TABLE, parse_fd_table),
    },
    Setting {
        name: "MEMSHIM_CUDA_IDLE_MS",
        default: "0",
        doc: "return PyTorch's unused cached VRAM and pinned host memory after the process has been idle this long (ms); 0 = off (not yet verified on a GPU)",
        expect: "milliseconds from 1000 to 86400000, or 0 for off",
        value: Value::Int(&CUDA_IDLE_MS, parse_cuda_idle_ms),
    },
    Setting {
        name: "MEMSHIM_CUDA_IDLE_MIN_MB",
        default: "256",
        doc: "the idle return acts only when at least this many MiB of VRAM and pinned host memory sit unused in PyTorch's caches",
        expect: "MiB from 1 to 1048576",
        value: Value::Int(&CUDA_IDLE_MIN_MB, parse_cuda_idle_min_mb),
    },
    Setting {
        name: "MEMSHIM_LIB",
        default: "(next to memshim-ctl)",
        doc: "memshim-ctl only: path of libmemshim.so for `memshim-ctl run`",
        expect: "",
        value: Value::Cli,
    },
];

// --- parsers ------------------------------------------------------------------

/// The value lower-cased if it is a short keyword (longer values match no
/// keyword).
fn keyword(v: &[u8]) -> StackBuf<16> {
    let mut out = StackBuf::<16>::new();
    if v.len() <= 16 {
        for b in v {
            out.push(&[b.to_ascii_lowercase()]);
        }
    }
    out
}

/// A boolean: 1/0, true/false, yes/no, on/off (any case).
pub fn parse_bool(v: &[u8]) -> Option<i64> {
    match keyword(v).as_bytes() {
        b"1" | b"true" | b"yes" | b"on" => Some(1),
        b"0" | b"false" | b"no" | b"off" => Some(0),
        _ => None,
    }
}

/// A decay time: whole milliseconds, or -1 for never.
pub fn parse_decay(v: &[u8]) -> Option<i64> {
    os::parse_i64(v).filter(|&n| n == DECAY_NEVER || (0..=MAX_DECAY_MS).contains(&n))
}

/// Largest arena count ([`endpoint::MAX_NARENAS`], shared with memshim-ctl).
const MAX_NARENAS: i64 = endpoint::MAX_NARENAS as i64;

/// `0` (off) or 1 s to a day: a shorter idle time would empty the cache
/// between the requests of a server that is merely between bursts.
pub fn parse_cuda_idle_ms(v: &[u8]) -> Option<i64> {
    os::parse_i64(v).filter(|&n| n == 0 || (1000..=86_400_000).contains(&n))
}

/// 1 MiB to 1 TiB.
pub fn parse_cuda_idle_min_mb(v: &[u8]) -> Option<i64> {
    os::parse_i64(v).filter(|&n| (1..=1 << 20).contains(&n))
}

/// `auto` (0) or 1..=4094.
pub fn parse_narenas(v: &[u8]) -> Option<i64> {
    if keyword(v).as_bytes() == b"auto" {
        return Some(0);
    }
    os::parse_i64(v).filter(|n| (1..=MAX_NARENAS).contains(n))
}

/// `auto`, `on` (or a true boolean), `off` (or a false one).
pub fn parse_control(v: &[u8]) -> Option<i64> {
    if keyword(v).as_bytes() == b"auto" {
        return Some(Control::Auto as i64);
    }
    parse_bool(v).map(|b| if b == 1 { Control::On } else { Control::Off } as i64)
}

/// `on` (or a true boolean), `off` (or a false one), `gc`.
pub fn parse_pressure(v: &[u8]) -> Option<i64> {
    if keyword(v).as_bytes() == b"gc" {
        return Some(Pressure::Gc as i64);
    }
    parse_bool(v).map(|b| if b == 1 { Pressure::On } else { Pressure::Off } as i64)
}

/// A whole percentage from 10 to 99 (an optional trailing `%`).
pub fn parse_percent(v: &[u8]) -> Option<i64> {
    let v = v.strip_suffix(b"%").unwrap_or(v);
    os::parse_i64(v).filter(|n| (10..=99).contains(n))
}

/// `auto` or `shared`.
pub fn parse_fd_table(v: &[u8]) -> Option<i64> {
    match keyword(v).as_bytes() {
        b"auto" => Some(0),
        b"shared" => Some(1),
        _ => None,
    }
}

/// Longest raw jemalloc conf passed on from one variable.
const MAX_RAW_CONF: usize = 2048;

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

// --- loading ------------------------------------------------------------------

static LOADED: AtomicBool = AtomicBool::new(false);
/// Longest composed configuration: memshim's defaults and knobs, and up to
/// 2048 bytes from each of `MALLOC_CONF`, `_RJEM_MALLOC_CONF` and
/// `MEMSHIM_MALLOC_CONF` (it was kept in 2048 bytes, which could cut a
/// long one in the middle of a value).
const CONF_MAX: usize = 8192;

/// jemalloc's configuration, NUL-terminated: composed by [`compose_conf`]
/// in place, once, and only read afterwards. A static, not the stack:
/// composing runs at the first `malloc`, on whatever stack the program has
/// (a small `ulimit -s` overflowed with the buffer there).
struct Composed(UnsafeCell<StackBuf<{ CONF_MAX + 1 }>>, AtomicU32);
// SAFETY: written only in `load` (single-threaded, before LOADED is
// published with Release); the length is published after the bytes.
unsafe impl Sync for Composed {}
static JEMALLOC_CONF: Composed = Composed(UnsafeCell::new(StackBuf::new()), AtomicU32::new(0));

impl Composed {
    /// The composed bytes (without the NUL).
    fn get(&self) -> &[u8] {
        let n = self.1.load(Acquire) as usize;
        // SAFETY: the first `n` bytes were written before `n` was published.
        unsafe { &(*self.0.get()).as_bytes()[..n] }
    }
}
/// The composed string holds options written by the user (`MALLOC_CONF`,
/// `_RJEM_MALLOC_CONF`, `MEMSHIM_MALLOC_CONF`), which only jemalloc checks.
static RAW_CONF: AtomicBool = AtomicBool::new(false);

fn show(v: &[u8]) -> &str {
    core::str::from_utf8(v).unwrap_or("(not UTF-8)")
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

/// Parses every `MEMSHIM_*` variable once per process. Called from
/// jemalloc's initialisation and from the constructor; whichever comes
/// first does the work, in a single-threaded context. Allocation-free.
pub fn load() {
    if LOADED.load(Acquire) {
        return;
    }
    // One walk of the environment for every setting (this runs in every
    // exec, inside jemalloc's initialisation).
    let names: [&[u8]; TABLE.len()] = core::array::from_fn(|i| TABLE[i].name.as_bytes());
    for (s, v) in TABLE.iter().zip(os::env::vars(&names)) {
        let Some(v) = v else {
            continue;
        };
        match s.value {
            Value::Int(slot, parse) => match parse(v) {
                Some(n) => {
                    slot.value.store(n, Relaxed);
                    slot.set.store(true, Relaxed);
                }
                None => bad(s.name, v, s.expect, s.default),
            },
            // An empty MEMSHIM_MALLOC_CONF is "nothing", not an error.
            Value::Text(slot, valid) => {
                if valid(v) {
                    // SAFETY: single-threaded, before LOADED is published.
                    unsafe { slot.set(v) };
                } else {
                    bad(s.name, v, s.expect, s.default);
                }
            }
            Value::Cli => {}
        }
    }
    compose_conf();
    LOADED.store(true, Release);
}

/// Builds the string jemalloc parses (see the module docs for the order).
fn compose_conf() {
    // SAFETY: single-threaded, before LOADED is published (`load`).
    let s = unsafe { &mut *JEMALLOC_CONF.0.get() };
    s.clear();
    let sep = |s: &mut StackBuf<{ CONF_MAX + 1 }>| {
        if !s.as_bytes().is_empty() && s.as_bytes().last() != Some(&b',') {
            s.push(b",");
        }
    };
    // 1. memshim defaults. `oversize_threshold:0` turns off jemalloc's
    //    dedicated arena for allocations >= 8 MiB, which purges them
    //    immediately and makes tensor-sized buffers re-fault on every reuse;
    //    with it off, large buffers follow the same decay as everything else
    //    (in the first arena, below 32 MiB and while the shim's thread runs:
    //    jemalloc.rs, "Large frees in the first arena").
    //    `tcache_gc_incr_bytes`: jemalloc 5.3.1 checks its thread-cache GC
    //    every 64 KiB a thread allocates (and runs it at most every 10 ms);
    //    each check reads the clock, which for 1-64 KiB allocations is every
    //    few calls. Checking every 1 MiB keeps the GC's cadence in busy
    //    threads and saves about 0.7 M of the 1.8 M instructions the shim
    //    added to CPython's start-up (bench/FINDINGS-issue15.md).
    //    `cache_oblivious:false`: jemalloc's default puts every allocation of
    //    16 KiB and more at a random cache-line offset in one extra page
    //    (16 KiB takes 20 KiB; the pages a written buffer touches grow by
    //    one), and a buffer grown by `realloc` in whole pages can then
    //    rarely grow where it lies: growing one in 1 MiB steps to 512 MiB
    //    took 128 s instead of 6.8 s (glibc 0.9 s, with `mremap`). Without
    //    it, large blocks are page-aligned, as glibc's mmapped chunks are.
    let _ = write!(
        s,
        "dirty_decay_ms:{},muzzy_decay_ms:{},oversize_threshold:0,tcache_gc_incr_bytes:1048576,cache_oblivious:false",
        DIRTY_DECAY_MS_DEFAULT, MUZZY_DECAY_MS_DEFAULT
    );
    if let Some(n) = auto_narenas() {
        let _ = write!(s, ",narenas:{n}");
    }
    //    Under an address-space limit (`ulimit -v`: RLIMIT_AS; RLIMIT_DATA,
    //    which counts private writable mappings), what jemalloc keeps for
    //    reuse after returning its pages (`retain`) still counts against the
    //    limit, though it holds no memory: a later large allocation then
    //    fails where glibc's, which unmaps, succeeds. There, unmap too.
    if os::raw::limited(libc::RLIMIT_AS) || os::raw::limited(libc::RLIMIT_DATA) {
        let _ = write!(s, ",retain:false");
    }
    // 2. Configuration written for a stock jemalloc.
    let stock = ["MALLOC_CONF", "_RJEM_MALLOC_CONF"];
    let values = os::env::vars(&stock.map(str::as_bytes));
    for (name, v) in stock.into_iter().zip(values) {
        if let Some(v) = v.filter(|v| !v.is_empty()) {
            if valid_raw_conf(v) {
                sep(s);
                s.push(v);
                RAW_CONF.store(true, Relaxed);
            } else {
                bad(
                    name,
                    v,
                    "jemalloc options like key:value,key:value, at most 2048 printable characters",
                    "(ignored)",
                );
            }
        }
    }
    // 3. Our own knobs, only where the user set them.
    for (key, slot) in [
        ("dirty_decay_ms", &DIRTY_DECAY_MS),
        ("muzzy_decay_ms", &MUZZY_DECAY_MS),
    ] {
        if slot.is_set() {
            sep(s);
            let _ = write!(s, "{key}:{}", slot.get());
        }
    }
    if NARENAS.get() != 0 {
        sep(s);
        let _ = write!(s, "narenas:{}", NARENAS.get());
    }
    // 4. Expert override.
    if !MALLOC_CONF.get().is_empty() {
        sep(s);
        s.push(MALLOC_CONF.get());
        RAW_CONF.store(true, Relaxed);
    }
    if let Some(pair) = tcache_clipped(s.as_bytes()) {
        log::warning(format_args!(
            "{} asks for more than this build's jemalloc caches per thread; it uses tcache_max:{TCACHE_MAX_LIMIT} (jemalloc 5.3.1 caps it at 8 of its pages)",
            show(pair),
        ));
    }
    // Room for the NUL; no setting holds one (they come from the
    // environment).
    s.truncate(CONF_MAX);
    let n = s.as_cstr().map_or(0, |c| c.to_bytes().len());
    JEMALLOC_CONF.1.store(n as u32, Release);
}

/// Largest `tcache_max` this build's jemalloc accepts (from `build.rs`).
const TCACHE_MAX_LIMIT: u64 = match u64::from_str_radix(env!("MEMSHIM_JE_TCACHE_MAX_LIMIT"), 10) {
    Ok(v) => v,
    Err(_) => 32768,
};

/// jemalloc 5.3.1 clips `tcache_max` (and `lg_tcache_max`) to
/// [`TCACHE_MAX_LIMIT`] without a message, so `tcache_max:65536` silently
/// reads back as 32768 (bench/FINDINGS-issue15.md, (b)). Returns the pair
/// that asks for more, if the last such setting in the composed string (the
/// one jemalloc applies) does.
fn tcache_clipped(conf: &[u8]) -> Option<&[u8]> {
    let mut asked: Option<(&[u8], u64)> = None;
    for pair in conf.split(|&b| b == b',') {
        let Some(k) = pair.iter().position(|&b| b == b':') else {
            continue;
        };
        let (key, val) = (&pair[..k], &pair[k + 1..]);
        match key {
            b"tcache_max" => asked = os::parse_u64(val).map(|v| (pair, v)),
            b"lg_tcache_max" => {
                asked = os::parse_u64(val)
                    .map(|m| (pair, 1u64.checked_shl(m as u32).unwrap_or(u64::MAX)))
            }
            _ => {}
        }
    }
    asked.filter(|&(_, v)| v > TCACHE_MAX_LIMIT).map(|(p, _)| p)
}

/// CPUs the process may really use, for the verbose report: the affinity
/// mask, and the cgroup CPU quota if there is one.
pub fn effective_cpus() -> (u32, Option<u32>) {
    (os::raw::affinity_cpus(), cgroup_quota_cpus())
}

/// The CPU quota in whole CPUs (rounded up): `cpu.max` in v2,
/// `cpu.cfs_quota_us` / `cpu.cfs_period_us` in v1, read where a container
/// sees its own cgroup. Raw system calls (see the module docs).
fn cgroup_quota_cpus() -> Option<u32> {
    let mut buf = [0u8; 128];
    // cgroup v2: "max 100000" or "<quota> <period>".
    if let Some(n) = os::raw::read_file(c"/sys/fs/cgroup/cpu.max", &mut buf) {
        let mut it = buf[..n]
            .split(|b| b.is_ascii_whitespace())
            .filter(|f| !f.is_empty());
        let quota = os::parse_u64(it.next()?)?;
        let period = os::parse_u64(it.next()?)?;
        return quota_to_cpus(quota, period);
    }
    // cgroup v1: the quota is -1 when there is none, and then the period
    // does not matter (this runs in every exec).
    let n = os::raw::read_file(c"/sys/fs/cgroup/cpu/cpu.cfs_quota_us", &mut buf)?;
    let quota = u64::try_from(os::parse_i64(buf[..n].trim_ascii())?).ok()?;
    let n = os::raw::read_file(c"/sys/fs/cgroup/cpu/cpu.cfs_period_us", &mut buf)?;
    let period = os::parse_u64(buf[..n].trim_ascii())?;
    quota_to_cpus(quota, period)
}

fn quota_to_cpus(quota: u64, period: u64) -> Option<u32> {
    if period == 0 || quota == 0 {
        return None;
    }
    Some(quota.div_ceil(period).clamp(1, 1 << 16) as u32)
}

/// `narenas` for the defaults: only when a quota is tighter than the
/// affinity mask (otherwise jemalloc's own default is already right).
/// Containers limited by quota still see every host CPU in their affinity
/// mask, and jemalloc would create 4 arenas per host CPU: on a 192-CPU node
/// that is 768 arenas, and memory spread over hundreds of arenas is hard to
/// reuse.
/// One arena per CPU would lower peak RSS, but two busy threads can then
/// share an arena while another sits idle (bench/FINDINGS-issue15.md, (d)).
fn auto_narenas() -> Option<u32> {
    // No quota is tighter than one CPU (a quota rounds up to whole CPUs):
    // then the cgroup files are not read at all.
    let affinity = os::raw::affinity_cpus();
    if affinity <= 1 {
        return None;
    }
    let quota = cgroup_quota_cpus()?;
    (quota < affinity).then(|| (4 * quota).min(MAX_NARENAS as u32))
}

/// The configuration string for jemalloc, NUL-terminated (loading the
/// settings first if needed). For `exports::wrap_secure_getenv`.
pub fn jemalloc_conf_ptr() -> *const c_char {
    load();
    // SAFETY: `load` composed it (NUL-terminated) and nothing writes it again.
    unsafe { (*JEMALLOC_CONF.0.get()).as_ptr().cast() }
}

// --- accessors ----------------------------------------------------------------

/// Whether jemalloc's configuration includes options the user wrote in
/// jemalloc's own syntax (which only jemalloc validates, when it
/// initialises).
pub fn raw_jemalloc_conf() -> bool {
    load();
    RAW_CONF.load(Relaxed)
}

/// `MEMSHIM_DIRTY_DECAY_MS` (jemalloc's `opt.dirty_decay_ms` is the final
/// word; see `jemalloc::opts`).
pub fn dirty_decay_ms() -> i64 {
    DIRTY_DECAY_MS.get()
}
/// `MEMSHIM_CUDA_IDLE_MS` (0: off).
pub fn cuda_idle_ms() -> u64 {
    CUDA_IDLE_MS.get().max(0) as u64
}

/// `MEMSHIM_CUDA_IDLE_MIN_MB`, in bytes.
pub fn cuda_idle_min_bytes() -> u64 {
    (CUDA_IDLE_MIN_MB.get().max(1) as u64) << 20
}

/// `MEMSHIM_CONTROL`.
pub fn control() -> Control {
    match CONTROL.get() {
        1 => Control::On,
        2 => Control::Off,
        _ => Control::Auto,
    }
}
/// `MEMSHIM_PRESSURE`.
pub fn pressure() -> Pressure {
    match PRESSURE.get() {
        0 => Pressure::Off,
        2 => Pressure::Gc,
        _ => Pressure::On,
    }
}
/// `MEMSHIM_PRESSURE_THRESHOLD`, in percent.
pub fn pressure_threshold_pct() -> u64 {
    PRESSURE_THRESHOLD.get().clamp(10, 99) as u64
}
/// `MEMSHIM_CLEAR_DEEPBIND`.
pub fn clear_deepbind() -> bool {
    CLEAR_DEEPBIND.get() != 0
}
/// `MEMSHIM_VERBOSE`.
pub fn verbose() -> bool {
    VERBOSE.get() != 0
}
/// `MEMSHIM_FD_TABLE`.
pub fn fd_table() -> FdTable {
    if FD_TABLE.get() == 1 {
        FdTable::Shared
    } else {
        FdTable::Auto
    }
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
/// Called from the constructor.
pub fn warn_unknown() {
    for entry in os::env::entries() {
        let Some(rest) = entry.strip_prefix(b"MEMSHIM_") else {
            continue;
        };
        let name_len = rest.iter().position(|&b| b == b'=').unwrap_or(rest.len());
        let name = &entry[..8 + name_len];
        if !TABLE.iter().any(|s| s.name.as_bytes() == name) {
            log::warning(format_args!(
                "{} is not a memshim setting and is ignored (see docs/configuration.md)",
                show(name)
            ));
        }
    }
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
        rejects(
            parse_decay,
            &[
                b"",
                b"-2",
                b"1e3",
                b"abc",
                b" 5",
                b"99999999999999999999",
                b"1000000000001",
            ],
        );
    }

    fn rejects(parse: fn(&[u8]) -> Option<i64>, bad: &[&[u8]]) {
        for b in bad {
            assert_eq!(parse(b), None, "{b:?}");
        }
    }

    #[test]
    fn tcache_max_above_the_limit_is_named() {
        assert_eq!(
            TCACHE_MAX_LIMIT,
            if cfg!(target_arch = "aarch64") {
                1 << 19
            } else {
                1 << 15
            }
        );
        let big = format!("tcache_max:{}", TCACHE_MAX_LIMIT * 2);
        let conf = format!("dirty_decay_ms:1000,{big},narenas:4");
        assert_eq!(tcache_clipped(conf.as_bytes()), Some(big.as_bytes()));
        let ok = format!("{big},tcache_max:{TCACHE_MAX_LIMIT}");
        assert_eq!(tcache_clipped(ok.as_bytes()), None, "the last setting wins");
        assert_eq!(
            tcache_clipped(b"lg_tcache_max:30"),
            Some(&b"lg_tcache_max:30"[..])
        );
        assert_eq!(tcache_clipped(b"lg_tcache_max:12,tcache_max:x"), None);
    }

    #[test]
    fn cuda_idle_values() {
        assert_eq!(parse_cuda_idle_ms(b"0"), Some(0));
        assert_eq!(parse_cuda_idle_ms(b"30000"), Some(30000));
        rejects(
            parse_cuda_idle_ms,
            &[b"-1", b"999", b"86400001", b"1s", b""],
        );
        assert_eq!(parse_cuda_idle_min_mb(b"256"), Some(256));
        rejects(parse_cuda_idle_min_mb, &[b"0", b"-5", b"1048577", b"x"]);
    }

    #[test]
    fn narenas_values() {
        assert_eq!(parse_narenas(b"auto"), Some(0));
        assert_eq!(parse_narenas(b"AUTO"), Some(0));
        assert_eq!(parse_narenas(b"1"), Some(1));
        assert_eq!(parse_narenas(b"4094"), Some(4094));
        // A leading `+`, as every numeric setting takes it (decay times too).
        assert_eq!(parse_narenas(b"+2"), Some(2));
        assert_eq!(parse_percent(b"+50"), Some(50));
        rejects(
            parse_narenas,
            &[b"0", b"4095", b"4096", b"-1", b"", b"many"],
        );
    }

    #[test]
    fn control_fd_table_and_bool_values() {
        assert_eq!(parse_control(b"auto"), Some(Control::Auto as i64));
        assert_eq!(parse_control(b"ON"), Some(Control::On as i64));
        assert_eq!(parse_control(b"yes"), Some(Control::On as i64));
        assert_eq!(parse_control(b"off"), Some(Control::Off as i64));
        assert_eq!(parse_control(b"sometimes"), None);
        assert_eq!(parse_fd_table(b"Shared"), Some(1));
        assert_eq!(parse_fd_table(b"private"), None);
        assert_eq!(parse_bool(b"Yes"), Some(1));
        assert_eq!(parse_bool(b"0"), Some(0));
        assert_eq!(parse_bool(b""), None);
        assert_eq!(parse_bool(b"2"), None);
        assert_eq!(parse_bool(b"a-very-long-value-indeed"), None);
    }

    #[test]
    fn pressure_values() {
        assert_eq!(parse_pressure(b"on"), Some(Pressure::On as i64));
        assert_eq!(parse_pressure(b"1"), Some(Pressure::On as i64));
        assert_eq!(parse_pressure(b"OFF"), Some(Pressure::Off as i64));
        assert_eq!(parse_pressure(b"gc"), Some(Pressure::Gc as i64));
        rejects(parse_pressure, &[b"", b"sometimes", b"gc,on", b"2"]);
        assert_eq!(parse_percent(b"90"), Some(90));
        assert_eq!(parse_percent(b"75%"), Some(75));
        assert_eq!(parse_percent(b"10"), Some(10));
        rejects(
            parse_percent,
            &[b"", b"9", b"100", b"0.9", b"-5", b"90 %", b"%"],
        );
    }

    #[test]
    fn raw_conf() {
        assert!(valid_raw_conf(b"narenas:2,tcache_max:4096"));
        assert!(!valid_raw_conf(b"narenas: 2"));
        assert!(!valid_raw_conf(&[b'a'; 2049]));
        assert!(valid_raw_conf(b""));
        assert!(valid_raw_conf(b"prof_prefix:/tmp/x:y,narenas:"));
        let bad: [&[u8]; 7] = [
            b"junk",
            b",",
            b"narenas:2,",
            b"a:1,,b:2",
            b":1",
            b"na-renas:1",
            b"narenas:2,junk",
        ];
        assert!(bad.iter().all(|b| !valid_raw_conf(b)));
    }

    #[test]
    fn quota_rounds_up() {
        assert_eq!(quota_to_cpus(150_000, 100_000), Some(2));
        assert_eq!(quota_to_cpus(50_000, 100_000), Some(1));
        assert_eq!(quota_to_cpus(0, 100_000), None);
    }

    #[test]
    fn every_row_parses_its_own_default() {
        for s in TABLE {
            match s.value {
                Value::Int(slot, parse) => {
                    assert_eq!(parse(s.default.as_bytes()), Some(slot.get()), "{}", s.name)
                }
                Value::Text(..) | Value::Cli => {}
            }
        }
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
