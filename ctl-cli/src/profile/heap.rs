//! A heap profile after symbolization, for `profile`: what it holds, how
//! it is shown (a table of call sites, folded stacks, JSON, a flame graph
//! in SVG), and the difference of two (docs/profile.md).
//!
//! Frames are kept innermost first, as jemalloc takes them, without the
//! allocator's own frames (those in libmemshim.so) and the wrappers that
//! only pass an allocation on (`operator new`, `PyMem_Malloc`, ...): the
//! first frame is the function that asked for the memory.

use crate::output::render::{bytes, table};
use crate::profile::symbols::{Frame, Symbolizer, holding};
use memshim_proto::{HeapDump, Mapping, python_frame_id};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Where the allocator's own frames are: cut from every stack.
const ALLOCATOR_LIBRARY: &str = "libmemshim.so";

/// Functions that only pass an allocation on to `malloc`: cut from the
/// inner end of a stack too, so that the allocating frame is the one that
/// asked (`PyByteArray_Resize`, not `_PyObject_Malloc`).
fn is_wrapper(function: &str) -> bool {
    const PY: &[&str] = &[
        "PyObject_Malloc",
        "PyObject_Calloc",
        "PyObject_Realloc",
        "PyMem_Malloc",
        "PyMem_Calloc",
        "PyMem_Realloc",
        "PyMem_RawMalloc",
        "PyMem_RawCalloc",
        "PyMem_RawRealloc",
    ];
    let f = function.trim_start_matches('_');
    PY.contains(&f)
        // operator new and new[] (all overloads), and glibc's strdup family.
        || function.starts_with("_Znw")
        || function.starts_with("_Zna")
        || matches!(function, "strdup" | "__strdup" | "strndup" | "__strndup")
}

/// Which native frames a stack with Python frames keeps
/// (`--native-frames`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum NativeFrames {
    /// The interpreter's own C frames (those in the library that holds
    /// `_PyEval_EvalFrameDefault`) are folded away, but the one that
    /// allocated: Python frames, and the native code of other libraries
    /// between them, remain.
    #[default]
    Fold,
    /// Every frame as sampled.
    All,
}

/// Whether a native frame runs Python code (each call of it runs one or
/// more of the Python frames before it in the stack).
fn is_eval(f: &Frame) -> bool {
    f.function.starts_with("_PyEval_EvalFrame")
}

/// Folds the interpreter's C frames out of a stack (innermost first) that
/// has Python frames: every frame of the library that runs them, but the
/// innermost (the function that asked for the memory). The shim puts each
/// group of Python frames just inside the native frame that runs them
/// (profile/python_stack.rs in the shim).
fn fold(frames: &mut Vec<Frame>) {
    if !frames.iter().any(Frame::is_python) {
        return;
    }
    // The library of each native frame that runs Python frames: the one
    // just outside a group of them (named or not: Debian's builds keep no
    // name for the eval loop's cold part), and any named as the eval loop.
    let interp: Vec<String> = frames
        .windows(2)
        .filter(|w| w[0].is_python() && !w[1].is_python())
        .map(|w| &w[1])
        .chain(frames.iter().filter(|f| is_eval(f)))
        .map(|f| f.library.clone())
        .collect();
    let mut i = 0;
    frames.retain(|f| {
        i += 1;
        i == 1 || f.is_python() || !interp.contains(&f.library)
    });
}

/// One call stack and what it holds live.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Stack {
    /// Estimated live bytes (negative in a difference: freed).
    pub bytes: i64,
    /// Estimated live allocations.
    pub objects: i64,
    /// Innermost first.
    pub frames: Vec<Frame>,
}

/// A symbolized profile (what `--format json` writes and `--diff` reads).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Profile {
    /// The process (absent in a difference).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    /// One sample per 2^lg_sample bytes allocated.
    pub lg_sample: u32,
    /// Estimated live bytes over all stacks.
    pub bytes: i64,
    /// Estimated live allocations over all stacks.
    pub objects: i64,
    /// By bytes, largest first.
    pub stacks: Vec<Stack>,
    /// The process's executable file mappings that the frames' addresses
    /// lie in, by address (empty in a difference).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub maps: Vec<Mapping>,
}

impl Profile {
    /// Symbolizes a dump of process `pid`, which sees itself as `own_pid`;
    /// with a line for each file left unnamed because the file at the
    /// process's path is not the one it mapped.
    pub fn from_dump(
        pid: i32,
        own_pid: i32,
        lg_sample: u32,
        d: &HeapDump,
        native: NativeFrames,
    ) -> (Profile, Vec<String>) {
        let mut sym = Symbolizer::new(Some((pid, own_pid)), d.maps.clone());
        let python: HashMap<u32, &memshim_proto::PythonFrame> =
            d.python_frames.iter().map(|f| (f.id, f)).collect();
        let mut lookup = |addr: u64| match python_frame_id(addr) {
            Some(id) => vec![match python.get(&id) {
                Some(f) => Frame::python(&f.function, &f.file, f.line),
                None => Frame::python("[Python frame]", "?", 0),
            }],
            None => sym.frames(addr),
        };
        let mut cache: HashMap<u32, Vec<Frame>> = HashMap::new();
        let mut merged: HashMap<Vec<Frame>, (i64, i64)> = HashMap::new();
        for s in &d.stacks {
            let mut frames: Vec<Frame> = s
                .frames
                .iter()
                .flat_map(|&i| {
                    cache
                        .entry(i)
                        .or_insert_with(|| lookup(d.addrs.get(i as usize).copied().unwrap_or(0)))
                        .clone()
                })
                .collect();
            let own = frames
                .iter()
                .take_while(|f| f.library == ALLOCATOR_LIBRARY || is_wrapper(&f.function))
                .count();
            frames.drain(..own.min(frames.len().saturating_sub(1)));
            if native == NativeFrames::Fold {
                fold(&mut frames);
            }
            let e = merged.entry(frames).or_default();
            e.0 += s.bytes as i64;
            e.1 += s.objects as i64;
        }
        let mut p = Profile::from_stacks(Some(pid), lg_sample, merged);
        // The mappings the frames lie in (a PyTorch process maps hundreds),
        // each frame looked up once.
        let maps = sym.maps();
        let mut used = vec![false; maps.len()];
        for f in p.stacks.iter().flat_map(|s| &s.frames) {
            if let Some(i) = holding(maps, f.address) {
                used[i] = true;
            }
        }
        p.maps = maps
            .iter()
            .zip(used)
            .filter(|(_, used)| *used)
            .map(|(m, _)| m.clone())
            .collect();
        (p, sym.mismatched().to_vec())
    }

    fn from_stacks(
        pid: Option<i32>,
        lg_sample: u32,
        m: HashMap<Vec<Frame>, (i64, i64)>,
    ) -> Profile {
        let mut stacks: Vec<Stack> = m
            .into_iter()
            .filter(|(_, (b, o))| *b != 0 || *o != 0)
            .map(|(frames, (bytes, objects))| Stack {
                bytes,
                objects,
                frames,
            })
            .collect();
        stacks.sort_by(|a, b| {
            b.bytes
                .cmp(&a.bytes)
                .then_with(|| a.frames.len().cmp(&b.frames.len()))
        });
        Profile {
            pid,
            lg_sample,
            bytes: stacks.iter().map(|s| s.bytes).sum(),
            objects: stacks.iter().map(|s| s.objects).sum(),
            stacks,
            maps: Vec::new(),
        }
    }

    /// `new` minus `old`, stack by stack: what grew (positive) and what was
    /// freed (negative) between the two.
    pub fn diff(old: &Profile, new: &Profile) -> Profile {
        let mut m: HashMap<Vec<Frame>, (i64, i64)> = HashMap::new();
        for (p, sign) in [(new, 1), (old, -1)] {
            for s in &p.stacks {
                let e = m.entry(s.frames.clone()).or_default();
                e.0 += sign * s.bytes;
                e.1 += sign * s.objects;
            }
        }
        Profile::from_stacks(None, new.lg_sample, m)
    }

    /// Per function: (bytes it allocated itself, bytes under it anywhere
    /// in the stack), by its own bytes, largest first. A function is one
    /// row whatever its lines (the frames of the rows have no `source`).
    pub fn by_function(&self) -> Vec<(Frame, i64, i64)> {
        let mut own: HashMap<Frame, i64> = HashMap::new();
        let mut cum: HashMap<Frame, i64> = HashMap::new();
        for s in &self.stacks {
            let functions: Vec<Frame> = s
                .frames
                .iter()
                .map(|f| Frame::new(f.function.as_str(), f.library.as_str()))
                .collect();
            if let Some(f) = functions.first() {
                *own.entry(f.clone()).or_default() += s.bytes;
            }
            let mut seen: Vec<&Frame> = Vec::new();
            for f in &functions {
                if !seen.contains(&f) {
                    seen.push(f);
                    *cum.entry(f.clone()).or_default() += s.bytes;
                }
            }
        }
        let mut rows: Vec<(Frame, i64, i64)> = cum
            .iter()
            .map(|(f, &c)| (f.clone(), own.get(f).copied().unwrap_or(0), c))
            .collect();
        rows.sort_by(|a, b| {
            b.1.abs()
                .cmp(&a.1.abs())
                .then(b.2.abs().cmp(&a.2.abs()))
                .then_with(|| a.0.function.cmp(&b.0.function))
        });
        rows
    }

    /// Per Python function (CPython 3.12+ under `-X perf`: the perf map
    /// names its trampolines): the bytes of the stacks it is the innermost
    /// Python function of. Empty without a perf map.
    pub fn by_python(&self) -> Vec<(String, i64)> {
        self.sum_by(|s| {
            s.frames
                .iter()
                .find(|f| f.library == crate::profile::symbols::PERF_MAP)
                .map(|f| f.function.clone())
        })
    }

    /// Per Python line (`file:line function`, the innermost Python frame
    /// of each stack, as samples carry them): the bytes under it. Empty
    /// when no sample had Python frames.
    pub fn by_python_line(&self) -> Vec<(String, i64)> {
        let line = self.python_line_names();
        self.sum_by(|s| s.frames.iter().find(|f| f.is_python()).map(&line))
    }

    /// Per Python stack (its Python frames only, outermost first, `<`
    /// between): the bytes under it.
    pub fn by_python_stack(&self) -> Vec<(String, i64)> {
        let line = self.python_line_names();
        self.sum_by(|s| {
            let lines: Vec<String> = s
                .frames
                .iter()
                .rev()
                .filter(|f| f.is_python())
                .map(&line)
                .collect();
            (!lines.is_empty()).then(|| lines.join(" > "))
        })
    }

    /// Bytes by the key each stack gives (stacks with none left out), by
    /// size, largest first.
    fn sum_by(&self, key: impl Fn(&Stack) -> Option<String>) -> Vec<(String, i64)> {
        let mut m: HashMap<String, i64> = HashMap::new();
        for s in &self.stacks {
            if let Some(k) = key(s) {
                *m.entry(k).or_default() += s.bytes;
            }
        }
        let mut v: Vec<(String, i64)> = m.into_iter().collect();
        v.sort_by(|a, b| b.1.abs().cmp(&a.1.abs()).then_with(|| a.0.cmp(&b.0)));
        v
    }

    /// Per library: the bytes its functions allocated themselves.
    pub fn by_library(&self) -> Vec<(String, i64)> {
        let mut m: HashMap<&str, i64> = HashMap::new();
        for s in &self.stacks {
            if let Some(f) = s.frames.first() {
                *m.entry(f.library.as_str()).or_default() += s.bytes;
            }
        }
        let mut v: Vec<(String, i64)> = m.into_iter().map(|(k, b)| (k.to_string(), b)).collect();
        v.sort_by(|a, b| b.1.abs().cmp(&a.1.abs()).then_with(|| a.0.cmp(&b.0)));
        v
    }

    /// The top `n` call sites: a table with each function's own live bytes
    /// and share, the bytes under it, and its library.
    pub fn top_table(&self, n: usize) -> String {
        let total = self.bytes.unsigned_abs().max(1) as f64;
        let rows: Vec<Vec<String>> = self
            .by_function()
            .into_iter()
            .filter(|r| r.1 != 0)
            .take(n)
            .map(|(f, own, cum)| {
                vec![
                    signed_bytes(own),
                    format!("{:.1}%", own as f64 * 100.0 / total),
                    signed_bytes(cum),
                    f.function,
                    f.library,
                ]
            })
            .collect();
        if rows.is_empty() {
            return "no live sampled allocations\n".into();
        }
        table(
            &["LIVE", "SHARE", "WITH CALLEES", "FUNCTION", "LIBRARY"],
            &rows,
        )
    }

    /// Folded stacks (`outer;...;inner bytes`), one line per stack, for
    /// flamegraph.pl, speedscope or inferno.
    pub fn folded(&self) -> String {
        let mut out = String::new();
        for s in &self.stacks {
            let names: Vec<String> = s
                .frames
                .iter()
                .rev()
                .map(|f| f.function.replace([';', '\n'], "_"))
                .collect();
            out.push_str(&format!("{} {}\n", names.join(";"), s.bytes));
        }
        out
    }
}

/// A Python frame as the views name it: `app.py:23 load_model`.
fn python_line(f: &Frame) -> String {
    format!("{} {}", f.place(), f.function)
}

impl Profile {
    /// How a Python frame is named in the tables: `file.py:LINE function`
    /// with the file's base name, or its whole path where two files of the
    /// profile share that base name (two packages' `util.py`), so that the
    /// tables, which sum by the name, keep them apart.
    fn python_line_names(&self) -> impl Fn(&Frame) -> String {
        let mut paths: HashMap<String, String> = HashMap::new();
        let mut shared = std::collections::HashSet::new();
        for f in self
            .stacks
            .iter()
            .flat_map(|s| &s.frames)
            .filter(|f| f.is_python())
        {
            if let Some((file, _)) = f.file_line() {
                let base = file.rsplit('/').next().unwrap_or(file);
                match paths.get(base) {
                    Some(p) if p != file => {
                        shared.insert(base.to_owned());
                    }
                    Some(_) => {}
                    None => {
                        paths.insert(base.to_owned(), file.to_owned());
                    }
                }
            }
        }
        move |f: &Frame| match f.file_line() {
            Some((file, line)) if shared.contains(file.rsplit('/').next().unwrap_or(file)) => {
                format!("{file}:{line} {}", f.function)
            }
            _ => python_line(f),
        }
    }
}

/// `1.5 MiB`, or `-1.5 MiB` for a negative figure.
pub fn signed_bytes(b: i64) -> String {
    if b < 0 {
        format!("-{}", bytes(b.unsigned_abs()))
    } else {
        bytes(b as u64)
    }
}

/// A profile of `stacks` (bytes, frames innermost first as (function,
/// library)), one allocation per stack (minus one for a freed one), taken
/// as they are: for the tests of the files that write profiles.
#[cfg(test)]
pub fn test_profile(stacks: &[(i64, &[(&str, &str)])]) -> Profile {
    Profile {
        pid: Some(7),
        lg_sample: 19,
        bytes: stacks.iter().map(|s| s.0).sum(),
        objects: stacks.iter().map(|s| s.0.signum()).sum(),
        stacks: stacks
            .iter()
            .map(|(bytes, frames)| Stack {
                bytes: *bytes,
                objects: bytes.signum(),
                frames: frames.iter().map(|(f, l)| Frame::new(*f, *l)).collect(),
            })
            .collect(),
        maps: vec![],
    }
}

/// The profile every output format's test writes: two live stacks of
/// `main`, one through a name with a `;` (folded stacks' separator), and
/// 1 MiB freed in libc10.so since sampling began.
#[cfg(test)]
pub fn sample_profile() -> Profile {
    test_profile(&[
        (2 << 20, &[("leaf;odd", "app"), ("main", "app")]),
        (1 << 20, &[("other", "app"), ("main", "app")]),
        (-(1 << 20), &[("alloc_cpu", "libc10.so"), ("main", "app")]),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(name: &str) -> Frame {
        Frame::new(name, "app")
    }

    fn native(name: &str, lib: &str) -> Frame {
        Frame::new(name, lib)
    }

    /// A stack as the shim weaves it (each group of Python frames inside
    /// the eval loop's frame, which may have no name), folded: the
    /// allocating function, the Python frames, and the native frames of
    /// other libraries between them remain.
    #[test]
    fn folding_keeps_the_allocator_python_frames_and_other_libraries() {
        let mut s = vec![
            native("PyByteArray_Resize", "libpython3.13.so"),
            native("type_call", "libpython3.13.so"),
            Frame::python("inner", "/app/b.py", 7),
            native("python3.13+0x4ff32", "libpython3.13.so"),
            native("call_back", "_ext.so"),
            native("PyObject_Call", "libpython3.13.so"),
            Frame::python("outer", "/app/a.py", 3),
            Frame::python("<module>", "/app/a.py", 9),
            native("_PyEval_EvalFrameDefault", "libpython3.13.so"),
            native("Py_RunMain", "libpython3.13.so"),
            native("__libc_start_main", "libc.so.6"),
        ];
        fold(&mut s);
        let names: Vec<&str> = s.iter().map(|f| f.function.as_str()).collect();
        assert_eq!(
            names,
            [
                "PyByteArray_Resize",
                "inner",
                "call_back",
                "outer",
                "<module>",
                "__libc_start_main"
            ]
        );
        // A stack without Python frames is left alone.
        let mut c = vec![native("a", "libx.so"), native("main", "libx.so")];
        fold(&mut c);
        assert_eq!(c.len(), 2);
    }

    /// Two files of one base name (two packages' `util.py`) stay apart in
    /// the Python views, named by their whole paths; they were summed as
    /// one `util.py:2 make`.
    #[test]
    fn python_views_keep_files_of_one_base_name_apart() {
        let mut p = test_profile(&[]);
        let stack = |bytes: i64, frames: Vec<Frame>| Stack {
            bytes,
            objects: 1,
            frames,
        };
        p.stacks = vec![
            stack(40, vec![Frame::python("make", "/p/a/util.py", 2)]),
            stack(20, vec![Frame::python("make", "/p/b/util.py", 2)]),
            stack(10, vec![Frame::python("run", "/p/app.py", 7)]),
        ];
        assert_eq!(
            p.by_python_line(),
            [
                ("/p/a/util.py:2 make".to_string(), 40),
                ("/p/b/util.py:2 make".to_string(), 20),
                ("app.py:7 run".to_string(), 10)
            ]
        );
    }

    /// The Python views: bytes by innermost Python line, and by Python
    /// stack, outermost first.
    #[test]
    fn python_views_sum_by_innermost_line_and_by_stack() {
        let mut p = test_profile(&[]);
        let stack = |bytes: i64, frames: Vec<Frame>| Stack {
            bytes,
            objects: 1,
            frames,
        };
        p.stacks = vec![
            stack(
                300,
                vec![
                    native("alloc", "libc10.so"),
                    Frame::python("load", "/s/app.py", 23),
                ],
            ),
            stack(
                200,
                vec![
                    native("alloc", "libc10.so"),
                    Frame::python("Linear.__init__", "/t/linear.py", 109),
                    Frame::python("load", "/s/app.py", 23),
                ],
            ),
            stack(50, vec![native("other", "liby.so")]),
        ];
        assert_eq!(
            p.by_python_line(),
            [
                ("app.py:23 load".to_string(), 300),
                ("linear.py:109 Linear.__init__".to_string(), 200)
            ]
        );
        assert_eq!(
            p.by_python_stack(),
            [
                ("app.py:23 load".to_string(), 300),
                (
                    "app.py:23 load > linear.py:109 Linear.__init__".to_string(),
                    200
                )
            ]
        );
    }

    fn profile(stacks: &[(i64, &[&str])]) -> Profile {
        let m = stacks
            .iter()
            .map(|(b, fr)| (fr.iter().map(|n| f(n)).collect(), (*b, 1)))
            .collect();
        Profile::from_stacks(Some(1), 19, m)
    }

    #[test]
    fn functions_are_ranked_by_what_they_allocated_themselves() {
        let p = profile(&[(64 << 20, &["leak", "main"]), (1 << 20, &["other", "main"])]);
        let rows = p.by_function();
        assert_eq!(rows[0], (f("leak"), 64 << 20, 64 << 20));
        assert_eq!(rows[1], (f("other"), 1 << 20, 1 << 20));
        assert_eq!(rows[2], (f("main"), 0, 65 << 20));
        let t = p.top_table(10);
        assert!(t.contains("64.0 MiB") && t.contains("98.5%"), "{t}");
        assert!(
            !t.contains("main"),
            "a function with no bytes of its own is not a call site: {t}"
        );
        assert_eq!(p.folded(), "main;leak 67108864\nmain;other 1048576\n");
    }

    #[test]
    fn a_difference_shows_only_what_changed() {
        let old = profile(&[(64 << 20, &["first", "main"])]);
        let new = profile(&[
            (64 << 20, &["first", "main"]),
            (32 << 20, &["second", "main"]),
        ]);
        let d = Profile::diff(&old, &new);
        assert_eq!(d.stacks.len(), 1);
        assert_eq!(d.stacks[0].frames[0], f("second"));
        assert_eq!(d.bytes, 32 << 20);
    }
}
