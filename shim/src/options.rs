//! The values of the `MEMSHIM_*` settings: read once, without allocating.
//!
//! What a setting is (its name, default, documentation, what a valid value
//! is, its parser) is `memshim_proto::settings`, shared with memshim-ctl,
//! and its list `settings::ALL` is the only one: the values live here in
//! slots in the same order ([`INTS`], [`TEXT_BYTES`]), fixed in size at compile
//! time. [`load`] walks that list; adding a setting is adding a spec in
//! proto (and to `ALL`) and, if the library reads it, an accessor here
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
//! did) for processes where jemalloc was never initialised. One default is
//! left out until jemalloc asks for the string: the arena count under a CPU
//! quota ([`add_auto_narenas`]), which reads the cgroup files, so that a
//! process that never allocates reads none.
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
use memshim_proto::settings::{self as spec, Kind, Spec, valid_raw_conf};
pub use memshim_proto::settings::{Control, FdTable, Pressure};
use memshim_proto::{cgroup, endpoint};

/// A numeric setting: its value, and whether it was set.
pub struct Int {
    value: AtomicI64,
    set: AtomicBool,
}

impl Int {
    const fn new(s: &Spec) -> Int {
        Int {
            value: AtomicI64::new(s.default_value()),
            set: AtomicBool::new(false),
        }
    }
    const fn unused() -> Int {
        Int {
            value: AtomicI64::new(0),
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
/// afterwards. Its slot in [`TEXT_LENS`] and [`TEXT_BYTES`]: the lengths
/// lie with what the constructor touches, so that reading an unset one
/// (every exec) faults in no page of the bytes.
#[derive(Clone, Copy)]
pub struct Text(usize);

/// Longest text value kept.
const TEXT_MAX: usize = spec::MAX_RAW_CONF;

/// The bytes of one text setting, NUL-terminated.
struct TextBytes(UnsafeCell<[u8; TEXT_MAX + 1]>);

// SAFETY: written only before LOADED is published with Release, read after
// an Acquire load of LOADED (the accessors check it).
unsafe impl Sync for TextBytes {}

impl Text {
    /// # Safety
    /// Only during `load`, before `LOADED` is set.
    unsafe fn set(self, bytes: &[u8]) {
        let n = bytes.len().min(TEXT_MAX);
        // SAFETY: the caller guarantees exclusive access.
        let buf = unsafe { &mut *TEXT_BYTES[self.0].0.get() };
        buf[..n].copy_from_slice(&bytes[..n]);
        buf[n] = 0;
        TEXT_LENS[self.0].store(n as u32, Release);
    }
    fn get(self) -> &'static [u8] {
        let n = TEXT_LENS[self.0].load(Acquire) as usize;
        if n == 0 {
            return &[];
        }
        // SAFETY: the first `n` bytes were written before `n` was published.
        unsafe { &(&*TEXT_BYTES[self.0].0.get())[..n] }
    }
}

/// How many settings there are: one slot each, in the order of
/// `memshim_proto::settings::ALL`, the one list of them.
const N: usize = spec::ALL.len();

touched_at_start! {
    /// The numeric settings' values: slot `i` holds `spec::ALL[i]`'s (and stays
    /// unused for a setting of another kind), starting at its default.
    static INTS: [Int; N] = {
        let mut ints = [const { Int::unused() }; N];
        let mut i = 0;
        while i < N {
            ints[i] = Int::new(spec::ALL[i]);
            i += 1;
        }
        ints
    };
}

/// How many text settings there are.
const TEXTS: usize = texts_before(N);

/// The text settings' bytes, in the order they come in `spec::ALL`.
static TEXT_BYTES: [TextBytes; TEXTS] =
    [const { TextBytes(UnsafeCell::new([0; TEXT_MAX + 1])) }; TEXTS];
touched_at_start! {
    /// Their lengths, 0 while unset.
    static TEXT_LENS: [AtomicU32; TEXTS] = [const { AtomicU32::new(0) }; TEXTS];
}

/// How many text settings come before `spec::ALL[i]`: the slot in
/// [`TEXT_BYTES`] of a text setting.
const fn texts_before(i: usize) -> usize {
    let (mut n, mut j) = (0, 0);
    while j < i {
        if matches!(spec::ALL[j].kind, Kind::Text { .. }) {
            n += 1;
        }
        j += 1;
    }
    n
}

/// Where `s` is in `spec::ALL`; evaluated at compile time (`int!`,
/// `text!`), so a setting missing there does not build.
const fn at(s: &Spec) -> usize {
    let mut i = 0;
    while i < N {
        if same(spec::ALL[i].name.as_bytes(), s.name.as_bytes()) {
            return i;
        }
        i += 1;
    }
    panic!("a setting that is not in memshim_proto::settings::ALL");
}

const fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The value slot of numeric setting `spec::$name`.
macro_rules! int {
    ($name:ident) => {
        &INTS[const { at(&spec::$name) }]
    };
}

/// The bytes of text setting `spec::$name`.
macro_rules! text {
    ($name:ident) => {
        Text(const { texts_before(at(&spec::$name)) })
    };
}

/// Largest arena count ([`endpoint::MAX_NARENAS`], shared with memshim-ctl).
const MAX_NARENAS: i64 = endpoint::MAX_NARENAS as i64;

// --- loading ------------------------------------------------------------------

/// Longest composed configuration: memshim's defaults and knobs, and up to
/// 2048 bytes from each of `MALLOC_CONF`, `_RJEM_MALLOC_CONF` and
/// `MEMSHIM_MALLOC_CONF` (it was kept in 2048 bytes, which could cut a
/// long one in the middle of a value).
const CONF_MAX: usize = 8192;

/// What [`load`] writes in every exec, in one place: the flag, then
/// jemalloc's configuration, NUL-terminated, with its length in front of its
/// bytes. Composed by [`compose_conf`] in place, once; [`add_auto_narenas`]
/// may put the arena count in front when jemalloc asks for it, and it is
/// only read afterwards. A static, not the stack: composing runs at the first `malloc`,
/// on whatever stack the program has (a small `ulimit -s` overflowed with
/// the buffer there). `repr(C)`, in this order, so that a process with a
/// configuration of ordinary length writes one page of it: the flag and the
/// length were on pages of their own (the flag elsewhere in `.bss`, the
/// length after the 8 KiB of bytes), three page faults in every exec where
/// one does (issue 48, item 1).
#[repr(C)]
struct Loaded {
    done: AtomicBool,
    /// [`add_auto_narenas`] ran.
    narenas_added: AtomicBool,
    conf_len: AtomicU32,
    conf: UnsafeCell<StackBuf<{ CONF_MAX + 1 }>>,
}
// SAFETY: `conf` is written in `load` (single-threaded, before `done` is
// published with Release) and at most once more by `add_auto_narenas`,
// under jemalloc's init lock, before anything reads it; its length is
// published after the bytes.
unsafe impl Sync for Loaded {}
// Last of the statics the constructor touches (`touched_at_start!`, in
// lib.rs), so that its head shares their page: in `.bss` its first page
// took two faults in every exec (read, then written).
#[unsafe(link_section = ".data.memshim_touched.tail")]
static LOADED: Loaded = Loaded {
    done: AtomicBool::new(false),
    narenas_added: AtomicBool::new(false),
    conf_len: AtomicU32::new(0),
    conf: UnsafeCell::new(StackBuf::new()),
};

impl Loaded {
    /// The composed bytes (without the NUL).
    fn conf(&self) -> &[u8] {
        let n = self.conf_len.load(Acquire) as usize;
        // SAFETY: the first `n` bytes were written before `n` was published.
        unsafe { &(*self.conf.get()).as_bytes()[..n] }
    }
}
touched_at_start! {
    /// The composed string holds options written by the user (`MALLOC_CONF`,
    /// `_RJEM_MALLOC_CONF`, `MEMSHIM_MALLOC_CONF`), which only jemalloc checks.
    static RAW_CONF: AtomicBool = AtomicBool::new(false);
}

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
#[unsafe(link_section = ".text.startup")]
pub fn load() {
    if LOADED.done.load(Acquire) {
        return;
    }
    // One walk of the environment for every setting (this runs in every
    // exec, inside jemalloc's initialisation).
    let names: [&[u8]; N] = core::array::from_fn(|i| spec::ALL[i].name.as_bytes());
    for (i, (s, v)) in spec::ALL.iter().zip(os::env::vars(&names)).enumerate() {
        let Some(v) = v else {
            continue;
        };
        match s.kind {
            Kind::Int { parse, .. } => match parse(v) {
                Some(n) => {
                    INTS[i].value.store(n, Relaxed);
                    INTS[i].set.store(true, Relaxed);
                }
                None => bad(s.name, v, s.expect, s.default),
            },
            // An empty MEMSHIM_MALLOC_CONF is "nothing", not an error.
            Kind::Text { valid } => {
                if valid(v) {
                    // SAFETY: single-threaded, before LOADED is published.
                    unsafe { Text(texts_before(i)).set(v) };
                } else {
                    bad(s.name, v, s.expect, s.default);
                }
            }
            Kind::Cli => {}
        }
    }
    compose_conf();
    LOADED.done.store(true, Release);
}

/// Builds the string jemalloc parses (see the module docs for the order).
#[unsafe(link_section = ".text.startup")]
fn compose_conf() {
    // SAFETY: single-threaded, before LOADED is published (`load`).
    let s = unsafe { &mut *LOADED.conf.get() };
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
    //    Written without `core::fmt`, as below in this step: it runs in
    //    every exec, and fmt's code is pages of its own.
    s.push(b"dirty_decay_ms:");
    s.push_i64(spec::DIRTY_DECAY_MS.default_value());
    s.push(b",muzzy_decay_ms:");
    s.push_i64(spec::MUZZY_DECAY_MS.default_value());
    s.push(b",oversize_threshold:0,tcache_gc_incr_bytes:1048576,cache_oblivious:false");
    //    The arena count under a CPU quota is not composed here but put in
    //    front when jemalloc asks for the string (`add_auto_narenas`).
    //    The heap profiler, ready but not sampling: `memshim-ctl profile`
    //    sets `prof.active` (jemalloc.rs, "Heap profiles"). Without
    //    `prof:true` here it can never be switched on in this process.
    if int!(PROFILE).get() != 0 {
        s.push(b",prof:true,prof_active:false");
    }
    //    Under an address-space limit (`ulimit -v`: RLIMIT_AS; RLIMIT_DATA,
    //    which counts private writable mappings), what jemalloc keeps for
    //    reuse after returning its pages (`retain`) still counts against the
    //    limit, though it holds no memory: a later large allocation then
    //    fails where glibc's, which unmaps, succeeds. There, unmap too.
    if os::raw::limited(libc::RLIMIT_AS) || os::raw::limited(libc::RLIMIT_DATA) {
        s.push(b",retain:false");
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
                bad(name, v, spec::RAW_CONF_EXPECT, "(ignored)");
            }
        }
    }
    // 3. Our own knobs, only where the user set them.
    for (key, slot) in [
        ("dirty_decay_ms", int!(DIRTY_DECAY_MS)),
        ("muzzy_decay_ms", int!(MUZZY_DECAY_MS)),
    ] {
        if slot.is_set() {
            sep(s);
            let _ = write!(s, "{key}:{}", slot.get());
        }
    }
    if int!(NARENAS).get() != 0 {
        sep(s);
        let _ = write!(s, "narenas:{}", int!(NARENAS).get());
    }
    // 4. Expert override.
    if !text!(MALLOC_CONF).get().is_empty() {
        sep(s);
        s.push(text!(MALLOC_CONF).get());
        RAW_CONF.store(true, Relaxed);
    }
    if let Some(pair) = tcache_clipped(s.as_bytes()) {
        log::warning(format_args!(
            "{} asks for more than this build's jemalloc caches per thread; it uses tcache_max:{TCACHE_MAX_LIMIT} (jemalloc 5.3.1 caps it at 8 of its pages)",
            show(pair),
        ));
    }
    // Room for the arena count `add_auto_narenas` may put in front, and for
    // the NUL; no setting holds one (they come from the environment).
    s.truncate(CONF_MAX - NARENAS_ROOM);
    publish(s);
}

/// NUL-terminates the composed string and publishes its length, after its
/// bytes (Release), for [`Loaded::conf`].
#[unsafe(link_section = ".text.startup")]
fn publish(s: &mut StackBuf<{ CONF_MAX + 1 }>) {
    let n = s.as_cstr().map_or(0, |c| c.to_bytes().len());
    LOADED.conf_len.store(n as u32, Release);
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

/// The CPU quota in whole CPUs (rounded up), the tightest of the
/// process's own cgroup and its ancestors that this mount namespace sees:
/// `cpu.max` in v2, `cpu.cfs_quota_us` / `cpu.cfs_period_us` in v1. The
/// process's cgroup is its line of `/proc/self/cgroup`: inside a cgroup
/// namespace it is `/` (the mount root), outside one the path below the
/// mount (a pod's `cpu.max` sits there: reading the root's alone found no
/// quota and sized the arenas for every host CPU). Raw system calls and
/// fixed buffers (see the module docs): this runs when jemalloc initialises
/// in every process whose affinity mask has more than one CPU and which
/// sets no arena count ([`add_auto_narenas`]).
#[unsafe(link_section = ".text.startup")]
fn cgroup_quota_cpus() -> Option<u32> {
    let mut text = [0u8; 2048];
    let n = os::raw::read_file(c"/proc/self/cgroup", &mut text).unwrap_or(0);
    let text = &text[..n];
    if os::raw::exists(c"/sys/fs/cgroup/cgroup.controllers") {
        let path = cgroup::proc_cgroup_path(text, None).unwrap_or(b"/");
        return tightest_quota(b"/sys/fs/cgroup", path, |dir, buf| {
            let n = read_in(dir, b"/cpu.max", buf)?;
            cgroup::parse_cpu_max(&buf[..n])
        });
    }
    // The first of v1's two usual mount names that exists is the cpu
    // controller (the other is a link to it, or absent).
    // A loop, not `Iterator::find`: its generic code would lie outside
    // `.text.startup`, a page fault of its own in every exec.
    let mut mount = None;
    for m in [&b"/sys/fs/cgroup/cpu"[..], b"/sys/fs/cgroup/cpu,cpuacct"] {
        let mut b = StackBuf::<64>::new();
        b.push(m);
        if b.as_cstr().is_some_and(os::raw::exists) {
            mount = Some(m);
            break;
        }
    }
    let mount = mount?;
    let path = cgroup::proc_cgroup_path(text, Some(b"cpu")).unwrap_or(b"/");
    tightest_quota(mount, path, |dir, buf| {
        let n = read_in(dir, b"/cpu.cfs_quota_us", buf)?;
        if buf[..n].trim_ascii() == b"-1" {
            return None; // no quota here: the period is not needed
        }
        let mut period = [0u8; 32];
        let m = read_in(dir, b"/cpu.cfs_period_us", &mut period)?;
        cgroup::parse_cfs(&buf[..n], &period[..m])
    })
}

/// Reads `dir` + `name` into `buf`; the bytes read, `None` if the file
/// cannot be opened.
#[unsafe(link_section = ".text.startup")]
fn read_in(dir: &[u8], name: &[u8], buf: &mut [u8]) -> Option<usize> {
    let mut path = StackBuf::<512>::new();
    path.push(dir);
    path.push(name);
    os::raw::read_file(path.as_cstr()?, buf)
}

/// The fewest CPUs any quota allows, from the cgroup at `mount` + `path` up
/// to `mount` itself (`read` gives a directory's quota). Where that
/// cgroup is not there (a container that sees the host's path but has its
/// own cgroup mounted at the root), the mount root alone.
#[unsafe(link_section = ".text.startup")]
fn tightest_quota(
    mount: &[u8],
    path: &[u8],
    read: impl Fn(&[u8], &mut [u8]) -> Option<(u64, u64)>,
) -> Option<u32> {
    let mut dir = StackBuf::<512>::new();
    dir.push(mount);
    let trimmed = path.strip_suffix(b"/").unwrap_or(path);
    if trimmed.len() > 1 {
        dir.push(trimmed);
    }
    if trimmed.len() > 1 && !os::raw::exists(dir.as_cstr()?) {
        dir.truncate(mount.len());
    }
    let mut best: Option<u32> = None;
    let mut buf = [0u8; 64];
    loop {
        if let Some((q, p)) = read(dir.as_bytes(), &mut buf) {
            if let Some(cpus) = cgroup::quota_cpus(q, p) {
                best = Some(best.map_or(cpus, |b| b.min(cpus)));
            }
        }
        let len = dir.as_bytes().len();
        if len <= mount.len() {
            return best;
        }
        let cut = dir.as_bytes().iter().rposition(|&b| b == b'/')?;
        dir.truncate(cut.max(mount.len()));
    }
}

/// `narenas` for the defaults: only when a quota is tighter than the
/// affinity mask (otherwise jemalloc's own default is already right).
/// Containers limited by quota still see every host CPU in their affinity
/// mask, and jemalloc would create 4 arenas per host CPU: on a 192-CPU node
/// that is 768 arenas, and memory spread over hundreds of arenas is hard to
/// reuse.
/// One arena per CPU would lower peak RSS, but two busy threads can then
/// share an arena while another sits idle (bench/FINDINGS-issue15.md, (d)).
#[unsafe(link_section = ".text.startup")]
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
/// settings first if needed). For `exports::wrap_secure_getenv`: jemalloc
/// asks for it once, when it initialises, holding its init lock. In
/// `.text.startup`, with what it inlines: it runs in every process that
/// allocates.
#[unsafe(link_section = ".text.startup")]
pub fn jemalloc_conf_ptr() -> *const c_char {
    load();
    add_auto_narenas();
    // SAFETY: `load` composed it (NUL-terminated), `add_auto_narenas` added
    // to it at most once, and nothing writes it again.
    unsafe { (*LOADED.conf.get()).as_ptr().cast() }
}

/// Room for the pair [`add_auto_narenas`] puts in front (`narenas:4094,`
/// at most).
const NARENAS_ROOM: usize = 16;

/// Puts `narenas:<4 × quota>,` in front of the composed string when a CPU
/// quota is tighter than the affinity mask ([`auto_narenas`]): first, among
/// memshim's defaults, so that every source after it still wins. Not
/// composed with them: the cgroup files are read only when jemalloc
/// initialises and asks for the string, so a process that never allocates
/// reads none (issue 48, item 1: nine system calls in every such exec).
/// Where a later pair sets a count in decimal, which wins anyway, nothing is
/// read either.
#[unsafe(link_section = ".text.startup")]
fn add_auto_narenas() {
    if LOADED.narenas_added.swap(true, AcqRel) {
        return;
    }
    // SAFETY: jemalloc holds its init lock while it asks for the string
    // (once, on one thread), and the one reader after `load`,
    // `report::print_verbose`, reads it after jemalloc has initialised.
    let s = unsafe { &mut *LOADED.conf.get() };
    if sets_narenas(s.as_bytes()) {
        return;
    }
    let Some(n) = auto_narenas() else {
        return;
    };
    let mut pair = StackBuf::<NARENAS_ROOM>::new();
    pair.push(b"narenas:");
    pair.push_i64(n.into());
    pair.push(b",");
    s.prepend(pair.as_bytes());
    publish(s);
}

/// Whether a pair of `conf` sets an arena count in decimal that jemalloc
/// accepts as it is (1 to [`MAX_NARENAS`]). Other forms it also reads
/// (`default`, hexadecimal, larger counts it lowers) are not looked into:
/// they still come after the pair [`add_auto_narenas`] puts in front. The
/// pairs are read as [`tcache_clipped`] reads them.
#[unsafe(link_section = ".text.startup")]
fn sets_narenas(conf: &[u8]) -> bool {
    conf.split(|&b| b == b',')
        .filter_map(|pair| pair.strip_prefix(b"narenas:"))
        .any(|v| os::parse_u64(v).is_some_and(|n| (1..=MAX_NARENAS as u64).contains(&n)))
}

// --- accessors ----------------------------------------------------------------

/// Whether jemalloc's configuration includes options the user wrote in
/// jemalloc's own syntax (which only jemalloc validates, when it
/// initialises).
#[unsafe(link_section = ".text.startup")]
pub fn raw_jemalloc_conf() -> bool {
    load();
    RAW_CONF.load(Relaxed)
}

/// `MEMSHIM_DIRTY_DECAY_MS` (jemalloc's `opt.dirty_decay_ms` is the final
/// word; see `jemalloc::opts`).
#[inline]
pub fn dirty_decay_ms() -> i64 {
    int!(DIRTY_DECAY_MS).get()
}
/// `MEMSHIM_CUDA_IDLE_MS` (0: off).
#[inline]
pub fn cuda_idle_ms() -> u64 {
    int!(CUDA_IDLE_MS).get().max(0) as u64
}

/// `MEMSHIM_CUDA_IDLE_MIN_MB`, in bytes.
#[inline]
pub fn cuda_idle_min_bytes() -> u64 {
    (int!(CUDA_IDLE_MIN_MB).get().max(1) as u64) << 20
}

/// `MEMSHIM_CONTROL`.
#[inline]
pub fn control() -> Control {
    // The attached bridge exists to serve: `attach` asked for its thread.
    if cfg!(memshim_bridge) {
        return Control::On;
    }
    Control::from_value(int!(CONTROL).get())
}
/// `MEMSHIM_PRESSURE`.
#[inline]
pub fn pressure() -> Pressure {
    Pressure::from_value(int!(PRESSURE).get())
}
/// `MEMSHIM_PRESSURE_THRESHOLD`, in percent.
#[inline]
pub fn pressure_threshold_pct() -> u64 {
    int!(PRESSURE_THRESHOLD).get().clamp(10, 99) as u64
}
/// `MEMSHIM_CLEAR_DEEPBIND`.
#[inline]
pub fn clear_deepbind() -> bool {
    int!(CLEAR_DEEPBIND).get() != 0
}
/// `MEMSHIM_PROFILE`: whether jemalloc's heap profiler is ready.
#[inline]
pub fn profile() -> bool {
    int!(PROFILE).get() != 0
}
/// `MEMSHIM_PROFILE=start`: sampling from the start.
#[inline]
pub fn profile_from_start() -> bool {
    int!(PROFILE).get() == 2
}
/// `MEMSHIM_VERBOSE`.
#[inline]
pub fn verbose() -> bool {
    int!(VERBOSE).get() != 0
}
/// `MEMSHIM_FD_TABLE`.
#[inline]
pub fn fd_table() -> FdTable {
    FdTable::from_value(int!(FD_TABLE).get())
}
/// `MEMSHIM_SOCKET_DIR` if set and valid.
#[inline]
pub fn socket_dir() -> Option<&'static [u8]> {
    let v = text!(SOCKET_DIR).get();
    (!v.is_empty()).then_some(v)
}
/// The configuration string handed to jemalloc.
#[inline]
pub fn jemalloc_conf() -> &'static [u8] {
    LOADED.conf()
}

/// Warns once about `MEMSHIM_*` variables that are not settings (typos).
/// Called from the constructor.
#[unsafe(link_section = ".text.startup")]
pub fn warn_unknown() {
    let first = spec::PREFIX.as_bytes()[0];
    for entry in os::env::entries_starting(|b| b == first) {
        let Some(rest) = entry.strip_prefix(spec::PREFIX.as_bytes()) else {
            continue;
        };
        let name_len = rest.iter().position(|&b| b == b'=').unwrap_or(rest.len());
        let name = &entry[..spec::PREFIX.len() + name_len];
        if spec::by_name(name).is_none() {
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
    fn only_a_decimal_count_jemalloc_takes_as_it_is_spares_the_quota() {
        assert!(sets_narenas(b"dirty_decay_ms:1000,narenas:3"));
        assert!(sets_narenas(b"narenas:4094,x:1"));
        for conf in [
            &b"dirty_decay_ms:1000"[..],
            b"narenas:default",
            b"narenas:0x10",
            b"narenas:0",
            b"narenas:5000",
            b"narenas:abc",
            b"xnarenas:3",
        ] {
            assert!(!sets_narenas(conf), "{}", show(conf));
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
    fn the_tightest_quota_from_the_cgroup_up_to_the_mount() {
        let d = std::env::temp_dir().join(format!("ms-quota-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("pod/c")).unwrap();
        let w = |rel: &str, v: &str| std::fs::write(d.join(rel).join("cpu.max"), v).unwrap();
        w(".", "max 100000\n");
        w("pod", "200000 100000\n");
        w("pod/c", "max 100000\n");
        let mount = d.to_str().unwrap().as_bytes();
        let read = |dir: &[u8], buf: &mut [u8]| {
            let n = read_in(dir, b"/cpu.max", buf)?;
            cgroup::parse_cpu_max(&buf[..n])
        };
        // The pod's quota, seen from its container's cgroup.
        assert_eq!(tightest_quota(mount, b"/pod/c", read), Some(2));
        // A tighter one below wins.
        w("pod/c", "50000 100000\n");
        assert_eq!(tightest_quota(mount, b"/pod/c/", read), Some(1));
        // Inside a cgroup namespace: the root alone.
        assert_eq!(tightest_quota(mount, b"/", read), None);
        // A path this namespace does not see: the root alone.
        assert_eq!(tightest_quota(mount, b"/elsewhere/x", read), None);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn every_setting_has_its_slot_and_starts_at_its_default() {
        for (i, s) in spec::ALL.iter().enumerate() {
            assert_eq!(at(s), i, "{}", s.name);
            if let Kind::Int { default, .. } = s.kind {
                assert_eq!(INTS[i].get(), default, "{}", s.name);
            }
        }
        assert_eq!(TEXTS, 2); // MEMSHIM_SOCKET_DIR, MEMSHIM_MALLOC_CONF
        assert_eq!(text!(MALLOC_CONF).0, 1);
    }

    #[test]
    fn docs_list_every_setting() {
        let doc = include_str!("../../docs/configuration.md");
        for s in spec::ALL {
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
