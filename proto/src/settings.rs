//! The `MEMSHIM_*` settings: every variable's name, its default, one line of
//! documentation, what a valid value is, and its parser. The one home of
//! these facts: the shim reads the table in every process
//! (`shim/src/options.rs` keeps the values), `memshim-ctl` checks and
//! shows the same variables with the same parsers, and
//! docs/configuration.md has one section per row (a test in the shim
//! checks it).
//!
//! The parsers run inside jemalloc's initialisation in every exec: they
//! take bytes, never allocate, never panic, and look at no locale.

use crate::endpoint::{DECAY_NEVER, MAX_DECAY_MS, MAX_NARENAS, MAX_SOCKET_DIR, valid_socket_dir};

/// One setting.
#[derive(Debug)]
pub struct Spec {
    /// Environment variable name.
    pub name: &'static str,
    /// The default, as the docs print it.
    pub default: &'static str,
    /// One line of documentation.
    pub doc: &'static str,
    /// What a valid value is, for the warning and the CLI's errors.
    pub expect: &'static str,
    /// How a value is read.
    pub kind: Kind,
}

/// How a setting's value is read.
#[derive(Debug)]
pub enum Kind {
    /// A number (or a keyword mapped to one).
    Int {
        /// The parser: `None` for a value that is not valid.
        parse: fn(&[u8]) -> Option<i64>,
        /// The default, as the parser returns it.
        default: i64,
    },
    /// Bytes kept as they are, if the function accepts them.
    Text {
        /// Whether a value is valid.
        valid: fn(&[u8]) -> bool,
    },
    /// Read by `memshim-ctl` only.
    Cli,
}

impl Spec {
    /// Parses a numeric setting's value (`None` for a bad one, or for a
    /// setting that is not numeric).
    pub fn parse(&self, v: &[u8]) -> Option<i64> {
        match self.kind {
            Kind::Int { parse, .. } => parse(v),
            _ => None,
        }
    }

    /// Whether `v` is a valid value of this setting.
    pub fn accepts(&self, v: &[u8]) -> bool {
        match self.kind {
            Kind::Int { parse, .. } => parse(v).is_some(),
            Kind::Text { valid } => valid(v),
            Kind::Cli => true,
        }
    }

    /// The default of a numeric setting (0 for the others).
    pub const fn default_value(&self) -> i64 {
        match self.kind {
            Kind::Int { default, .. } => default,
            _ => 0,
        }
    }
}

/// A setting that is one of a few words: the enum, the number each word's
/// parser returns, the word, and the variant any other number reads as.
macro_rules! words {
    ($(#[$doc:meta])* $name:ident, otherwise $other:ident,
     $($(#[$vdoc:meta])* $variant:ident = $n:literal $word:literal,)*) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Debug)]
        #[repr(u8)]
        pub enum $name {
            $($(#[$vdoc])* $variant = $n,)*
        }

        impl $name {
            /// The variant for the value its setting's parser returns.
            pub fn from_value(v: i64) -> $name {
                match v {
                    $($n => $name::$variant,)*
                    _ => $name::$other,
                }
            }

            /// Its word, as the docs and `stats` write it.
            pub fn word(self) -> &'static str {
                match self {
                    $($name::$variant => $word,)*
                }
            }
        }
    };
}

words! {
    /// When the shim may start its thread (docs/design.md, "Threads");
    /// [`parse_control`] reads it.
    Control, otherwise Auto,
    /// Start with the process's own second thread; stop when it is alone again.
    Auto = 0 "auto",
    /// Start in the constructor and never stop.
    On = 1 "on",
    /// Never start a thread.
    Off = 2 "off",
}

words! {
    /// What the shim's thread does when its memory cgroup is under
    /// pressure; [`parse_pressure`] reads it.
    Pressure, otherwise On,
    /// Do not watch.
    Off = 0 "off",
    /// Watch where a limit exists; purge on pressure.
    On = 1 "on",
    /// As `On`, and run Python's garbage collector before purging.
    Gc = 2 "gc",
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

impl FdTable {
    /// The value [`parse_fd_table`] returns for it.
    pub fn from_value(v: i64) -> FdTable {
        if v == 1 {
            FdTable::Shared
        } else {
            FdTable::Auto
        }
    }
}

const BOOL: &str = "a boolean: 1/0, true/false, yes/no, on/off";

/// `MEMSHIM_DIRTY_DECAY_MS`.
pub const DIRTY_DECAY_MS: Spec = Spec {
    name: "MEMSHIM_DIRTY_DECAY_MS",
    default: "1000",
    doc: "milliseconds until freed (dirty) pages are returned to the OS; -1 = never",
    expect: "milliseconds, or -1 for never",
    kind: Kind::Int {
        parse: parse_decay,
        default: 1000,
    },
};

/// `MEMSHIM_MUZZY_DECAY_MS`.
pub const MUZZY_DECAY_MS: Spec = Spec {
    name: "MEMSHIM_MUZZY_DECAY_MS",
    default: "0",
    doc: "milliseconds that MADV_FREE'd (muzzy) pages are kept before MADV_DONTNEED; -1 = never",
    expect: "milliseconds, or -1 for never",
    kind: Kind::Int {
        parse: parse_decay,
        default: 0,
    },
};

/// `MEMSHIM_NARENAS` (0: auto).
pub const NARENAS: Spec = Spec {
    name: "MEMSHIM_NARENAS",
    default: "auto",
    doc: "number of jemalloc arenas; auto = 4 per CPU the cgroup quota allows",
    expect: "auto, or a count from 1 to 4094",
    kind: Kind::Int {
        parse: parse_narenas,
        default: 0,
    },
};

/// `MEMSHIM_CONTROL` ([`Control`]).
pub const CONTROL: Spec = Spec {
    name: "MEMSHIM_CONTROL",
    default: "auto",
    doc: "auto: background purging and the control socket start with the process's second thread; on: at start-up; off: never",
    expect: "auto, on or off",
    kind: Kind::Int {
        parse: parse_control,
        default: Control::Auto as i64,
    },
};

/// `MEMSHIM_PRESSURE` ([`Pressure`]).
pub const PRESSURE: Spec = Spec {
    name: "MEMSHIM_PRESSURE",
    default: "on",
    doc: "on: the shim's thread watches the memory cgroup's limit and pressure and purges at once when memory runs short; gc: also runs Python's gc first; off: no watching",
    expect: "on, off or gc",
    kind: Kind::Int {
        parse: parse_pressure,
        default: Pressure::On as i64,
    },
};

/// `MEMSHIM_PRESSURE_THRESHOLD` (percent).
pub const PRESSURE_THRESHOLD: Spec = Spec {
    name: "MEMSHIM_PRESSURE_THRESHOLD",
    default: "90",
    doc: "percent of the cgroup's limit (v2: memory.high, else memory.max) at which the working set counts as pressure",
    expect: "a whole percentage from 10 to 99",
    kind: Kind::Int {
        parse: parse_percent,
        default: 90,
    },
};

/// `MEMSHIM_SOCKET_DIR`.
pub const SOCKET_DIR: Spec = Spec {
    name: "MEMSHIM_SOCKET_DIR",
    default: "/tmp/memshim-<uid>",
    doc: "directory of the per-process control sockets",
    expect: SOCKET_DIR_EXPECT,
    kind: Kind::Text {
        valid: valid_socket_dir,
    },
};

const SOCKET_DIR_EXPECT: &str = "an absolute path of at most 72 bytes";
const _: () = assert!(MAX_SOCKET_DIR == 72, "SOCKET_DIR_EXPECT names the limit");

/// `MEMSHIM_CLEAR_DEEPBIND`.
pub const CLEAR_DEEPBIND: Spec = Spec {
    name: "MEMSHIM_CLEAR_DEEPBIND",
    default: "1",
    doc: "strip RTLD_DEEPBIND from dlopen() so such libraries use the shim's malloc too",
    expect: BOOL,
    kind: Kind::Int {
        parse: parse_bool,
        default: 1,
    },
};

/// `MEMSHIM_MALLOC_CONF`.
pub const MALLOC_CONF: Spec = Spec {
    name: "MEMSHIM_MALLOC_CONF",
    default: "(empty)",
    doc: "raw jemalloc options, applied last, over everything else",
    expect: RAW_CONF_EXPECT,
    kind: Kind::Text {
        valid: valid_raw_conf,
    },
};

/// What a raw jemalloc configuration must look like (also for
/// `MALLOC_CONF` and `_RJEM_MALLOC_CONF`).
pub const RAW_CONF_EXPECT: &str =
    "jemalloc options like key:value,key:value, at most 2048 printable characters";

/// `MEMSHIM_VERBOSE`.
pub const VERBOSE: Spec = Spec {
    name: "MEMSHIM_VERBOSE",
    default: "0",
    doc: "print the effective settings once at start-up",
    expect: BOOL,
    kind: Kind::Int {
        parse: parse_bool,
        default: 0,
    },
};

/// `MEMSHIM_FD_TABLE` ([`FdTable`]).
pub const FD_TABLE: Spec = Spec {
    name: "MEMSHIM_FD_TABLE",
    default: "auto",
    doc: "auto: the shim's thread keeps its descriptors in a table of its own where the kernel allows it; shared: in the application's (the fallback, for tests)",
    expect: "auto or shared",
    kind: Kind::Int {
        parse: parse_fd_table,
        default: 0,
    },
};

/// `MEMSHIM_CUDA_IDLE_MS` (0: off).
pub const CUDA_IDLE_MS: Spec = Spec {
    name: "MEMSHIM_CUDA_IDLE_MS",
    default: "0",
    doc: "return PyTorch's unused cached VRAM and pinned host memory after the process has been idle this long (ms); 0 = off (not yet verified on a GPU)",
    expect: "milliseconds from 1000 to 86400000, or 0 for off",
    kind: Kind::Int {
        parse: parse_cuda_idle_ms,
        default: 0,
    },
};

/// `MEMSHIM_CUDA_IDLE_MIN_MB`. Below a quarter of a GiB, emptying the cache
/// saves less than the CUDA context itself costs (about 250-500 MiB per
/// device) and the next burst pays to refill it.
pub const CUDA_IDLE_MIN_MB: Spec = Spec {
    name: "MEMSHIM_CUDA_IDLE_MIN_MB",
    default: "256",
    doc: "the idle return acts only when at least this many MiB of VRAM and pinned host memory sit unused in PyTorch's caches",
    expect: "MiB from 1 to 1048576",
    kind: Kind::Int {
        parse: parse_cuda_idle_min_mb,
        default: 256,
    },
};

/// `MEMSHIM_PROFILE`: jemalloc's heap profiler, started with the process
/// but inactive (`prof:true,prof_active:false`) so that `memshim-ctl
/// profile` can switch sampling on and off from outside; `start`: sampling
/// from the start. Off by default: bench/FINDINGS-profiling.md has what it
/// costs.
pub const PROFILE: Spec = Spec {
    name: "MEMSHIM_PROFILE",
    default: "off",
    doc: "on: jemalloc's heap profiler is ready in the process, inactive until `memshim-ctl profile` starts sampling (one sample per 512 KiB allocated); start: sampling from the start; off: no profiling",
    expect: "on, off or start",
    kind: Kind::Int {
        parse: parse_profile,
        default: 0,
    },
};

/// `MEMSHIM_LIB` (memshim-ctl only).
pub const LIB: Spec = Spec {
    name: "MEMSHIM_LIB",
    default: "(next to memshim-ctl)",
    doc: "memshim-ctl only: path of libmemshim.so for `memshim-ctl run`",
    expect: "",
    kind: Kind::Cli,
};

/// Every setting, in the order the docs and reports list them.
pub const ALL: &[&Spec] = &[
    &DIRTY_DECAY_MS,
    &MUZZY_DECAY_MS,
    &NARENAS,
    &CONTROL,
    &PRESSURE,
    &PRESSURE_THRESHOLD,
    &SOCKET_DIR,
    &CLEAR_DEEPBIND,
    &MALLOC_CONF,
    &VERBOSE,
    &FD_TABLE,
    &CUDA_IDLE_MS,
    &CUDA_IDLE_MIN_MB,
    &PROFILE,
    &LIB,
];

/// The prefix every setting's name has.
pub const PREFIX: &str = "MEMSHIM_";

/// The setting named `name`.
pub fn by_name(name: &[u8]) -> Option<&'static Spec> {
    ALL.iter().copied().find(|s| s.name.as_bytes() == name)
}

// --- numbers and words, without allocating --------------------------------

/// An unsigned decimal number (digits only).
pub fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let mut v: u64 = 0;
    for &b in s {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(v)
}

/// A signed decimal number, with an optional `+` or `-`.
pub fn parse_i64(s: &[u8]) -> Option<i64> {
    match s.split_first() {
        Some((b'-', rest)) => parse_u64(rest).and_then(|v| 0i64.checked_sub_unsigned(v)),
        Some((b'+', rest)) => parse_u64(rest).and_then(|v| i64::try_from(v).ok()),
        _ => parse_u64(s).and_then(|v| i64::try_from(v).ok()),
    }
}

/// Whether `v` is the keyword `word` (ASCII, any case).
fn is(v: &[u8], word: &str) -> bool {
    v.eq_ignore_ascii_case(word.as_bytes())
}

/// A boolean: 1/0, true/false, yes/no, on/off (any case).
pub fn parse_bool(v: &[u8]) -> Option<i64> {
    if ["1", "true", "yes", "on"].iter().any(|w| is(v, w)) {
        Some(1)
    } else if ["0", "false", "no", "off"].iter().any(|w| is(v, w)) {
        Some(0)
    } else {
        None
    }
}

/// A decay time: whole milliseconds, or -1 for never.
pub fn parse_decay(v: &[u8]) -> Option<i64> {
    parse_i64(v).filter(|&n| n == DECAY_NEVER || (0..=MAX_DECAY_MS).contains(&n))
}

/// `auto` (0) or 1..=4094.
pub fn parse_narenas(v: &[u8]) -> Option<i64> {
    if is(v, "auto") {
        return Some(0);
    }
    parse_i64(v).filter(|n| (1..=i64::from(MAX_NARENAS)).contains(n))
}

/// `auto`, `on` (or a true boolean), `off` (or a false one).
pub fn parse_control(v: &[u8]) -> Option<i64> {
    if is(v, "auto") {
        return Some(Control::Auto as i64);
    }
    parse_bool(v).map(|b| if b == 1 { Control::On } else { Control::Off } as i64)
}

/// `on` (or a true boolean), `off` (or a false one), `gc`.
pub fn parse_pressure(v: &[u8]) -> Option<i64> {
    if is(v, "gc") {
        return Some(Pressure::Gc as i64);
    }
    parse_bool(v).map(|b| if b == 1 { Pressure::On } else { Pressure::Off } as i64)
}

/// `MEMSHIM_PROFILE`: off (or a false boolean) 0, on (or a true one) 1,
/// `start` 2.
pub fn parse_profile(v: &[u8]) -> Option<i64> {
    if is(v, "start") {
        return Some(2);
    }
    parse_bool(v)
}

/// A whole percentage from 10 to 99 (an optional trailing `%`).
pub fn parse_percent(v: &[u8]) -> Option<i64> {
    let v = v.strip_suffix(b"%").unwrap_or(v);
    parse_i64(v).filter(|n| (10..=99).contains(n))
}

/// `auto` or `shared`.
pub fn parse_fd_table(v: &[u8]) -> Option<i64> {
    if is(v, "auto") {
        Some(0)
    } else if is(v, "shared") {
        Some(1)
    } else {
        None
    }
}

/// `0` (off) or 1 s to a day: a shorter idle time would empty the cache
/// between the requests of a server that is merely between bursts.
pub fn parse_cuda_idle_ms(v: &[u8]) -> Option<i64> {
    parse_i64(v).filter(|&n| n == 0 || (1000..=86_400_000).contains(&n))
}

/// 1 MiB to 1 TiB.
pub fn parse_cuda_idle_min_mb(v: &[u8]) -> Option<i64> {
    parse_i64(v).filter(|&n| (1..=1 << 20).contains(&n))
}

/// A size in bytes: a whole number with an optional unit, `K`, `M`, `G`
/// or `T` (powers of 1024; `KiB`, `MB` and the like, any case, mean the
/// same), e.g. `512M`, `1.5G` is not accepted (whole numbers only).
pub fn parse_size(v: &[u8]) -> Option<u64> {
    let digits = v.iter().take_while(|b| b.is_ascii_digit()).count();
    let (num, unit) = v.split_at(digits);
    let n = parse_u64(num)?;
    let shift = match unit.first().map(u8::to_ascii_uppercase) {
        None => return Some(n),
        Some(b'B') if unit.len() == 1 => 0,
        Some(b'K') => 10,
        Some(b'M') => 20,
        Some(b'G') => 30,
        Some(b'T') => 40,
        _ => return None,
    };
    let rest = &unit[1..];
    if !(rest.is_empty() || is(rest, "b") || is(rest, "ib")) {
        return None;
    }
    n.checked_mul(1u64 << shift)
}

/// Longest raw jemalloc configuration passed on from one variable.
pub const MAX_RAW_CONF: usize = 2048;

/// Raw jemalloc conf: printable ASCII without spaces, bounded length, and
/// the shape `key:value(,key:value)*` with keys of `[A-Za-z0-9_]` (empty is
/// fine). The shape matters: jemalloc stops parsing at a malformed spot
/// (`junk`, `a:1,,b:2`, a trailing comma), which would silently drop every
/// setting composed after it (our knobs, `MEMSHIM_MALLOC_CONF`), and it
/// reports such strings twice. jemalloc itself validates each key and value
/// of a well-formed string (and the shim relays its message).
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rejects(parse: fn(&[u8]) -> Option<i64>, bad: &[&[u8]]) {
        for b in bad {
            assert_eq!(parse(b), None, "{b:?}");
        }
    }

    #[test]
    fn every_setting_parses_its_own_default_and_has_the_prefix() {
        for s in ALL {
            assert!(s.name.starts_with(PREFIX), "{}", s.name);
            if let Kind::Int { parse, default } = s.kind {
                assert_eq!(parse(s.default.as_bytes()), Some(default), "{}", s.name);
            }
            assert!(by_name(s.name.as_bytes()).is_some());
        }
        assert!(by_name(b"MEMSHIM_NOPE").is_none());
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_i64(b"+2"), Some(2));
        assert_eq!(parse_i64(b"-1"), Some(-1));
        assert_eq!(parse_i64(b"99999999999999999999"), None);
        assert_eq!(parse_u64(b""), None);
        assert_eq!(parse_u64(b" 5"), None);
    }

    #[test]
    fn decay_values() {
        assert_eq!(parse_decay(b"-1"), Some(-1));
        assert_eq!(parse_decay(b"0"), Some(0));
        assert_eq!(parse_decay(b"1000000000000"), Some(MAX_DECAY_MS));
        rejects(
            parse_decay,
            &[b"", b"-2", b"1e3", b"abc", b" 5", b"1000000000001"],
        );
    }

    #[test]
    fn words() {
        assert_eq!(parse_narenas(b"AUTO"), Some(0));
        assert_eq!(parse_narenas(b"+2"), Some(2));
        rejects(parse_narenas, &[b"0", b"4095", b"-1", b"", b"many"]);
        assert_eq!(parse_control(b"ON"), Some(1));
        assert_eq!(parse_control(b"no"), Some(2));
        assert_eq!(parse_control(b"sometimes"), None);
        assert_eq!(parse_pressure(b"GC"), Some(2));
        assert_eq!(parse_pressure(b"0"), Some(0));
        assert_eq!(parse_fd_table(b"Shared"), Some(1));
        assert_eq!(parse_bool(b"Yes"), Some(1));
        assert_eq!(parse_bool(b"a-very-long-value-indeed"), None);
        assert_eq!(parse_percent(b"75%"), Some(75));
        rejects(parse_percent, &[b"", b"9", b"100", b"0.9", b"90 %", b"%"]);
        assert_eq!(
            Control::from_value(parse_control(b"off").unwrap()).word(),
            "off"
        );
        assert_eq!(
            Pressure::from_value(parse_pressure(b"gc").unwrap()).word(),
            "gc"
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size(b"512"), Some(512));
        assert_eq!(parse_size(b"512M"), Some(512 << 20));
        assert_eq!(parse_size(b"2g"), Some(2 << 30));
        assert_eq!(parse_size(b"2GiB"), Some(2 << 30));
        assert_eq!(parse_size(b"64KB"), Some(64 << 10));
        assert_eq!(parse_size(b"1T"), Some(1 << 40));
        for bad in [
            &b""[..],
            b"M",
            b"1.5G",
            b"12Q",
            b"-1G",
            b"1 G",
            b"99999999999T",
        ] {
            assert_eq!(parse_size(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn raw_conf() {
        assert!(valid_raw_conf(b"narenas:2,tcache_max:4096"));
        assert!(!valid_raw_conf(b"narenas: 2"));
        assert!(!valid_raw_conf(&[b'a'; 2049]));
        assert!(valid_raw_conf(b""));
        assert!(valid_raw_conf(b"prof_prefix:/tmp/x:y,narenas:"));
        for b in [
            &b"junk"[..],
            b",",
            b"narenas:2,",
            b"a:1,,b:2",
            b":1",
            b"na-renas:1",
        ] {
            assert!(!valid_raw_conf(b), "{b:?}");
        }
    }
}
