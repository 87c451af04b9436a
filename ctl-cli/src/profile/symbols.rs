//! Addresses of another process to function names and source lines, for
//! `profile`.
//!
//! The process sends its executable file mappings with the profile; each
//! file is read here by blazesym: the very file the process mapped while it
//! runs (`/proc/PID/map_files`, which needs root or
//! `CAP_CHECKPOINT_RESTORE`), else through `/proc/PID/root` (a container's
//! files are its own), else at the path as given, but never by path once
//! the process's file was deleted or replaced. blazesym finds
//! the function in its symbol tables (`.symtab` where the file was not
//! stripped, `.dynsym` always) and, where the file or its separate debug
//! file has DWARF, the source file and line and the functions inlined at
//! that address. Separate debug files are found as gdb finds them: by
//! build id under `/usr/lib/debug/.build-id` (Debian's `-dbg` and
//! `-dbgsym` packages), or by the file's `.gnu_debuglink` name with its
//! CRC checked; in the process's root first, then this machine's. A
//! function that has no symbol is shown as `library+0xoffset`.
//!
//! C++ and Rust names are shown by [`demangle`]: the qualified name only,
//! without parameter types or template arguments, which is what a profile
//! table has room for.
//!
//! Code that is in no file (a JIT's) is looked up in the process's perf map,
//! `/tmp/perf-<pid>.map` (pid as the process sees itself), where CPython
//! 3.12+ run with `-X perf` names each Python function's trampoline
//! `py::<function>:<file>`.

use crate::reach::untrusted::{self, Links};
use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{CodeInfo, Input, Symbolized};
use memshim_proto::Mapping;
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;

/// Where an address is: its function (if a symbol covers it), its file,
/// and its source line where debug information has one.
///
/// Two frames are the same frame when their function, library and line
/// are: the address is left out of the comparison (two calls on one line,
/// or one function in two processes, are one frame of a profile and of a
/// difference), and a merged stack keeps one of its addresses.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Frame {
    /// The function's name, demangled; `lib+0x..` when there is no symbol.
    pub function: String,
    /// The file's name without its directory (`libtorch_cpu.so`).
    pub library: String,
    /// `file:line` of the address inside `function` (the line that
    /// allocated, or that called the next frame), from the library's
    /// DWARF; empty without debug information.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    /// The address in the process that was looked up (inside the call
    /// instruction of a return address), so that pprof can find the frame
    /// again in the file ([`super::pprof`]); the frames inlined at one
    /// address share it. 0: none (a frame made here, or a difference's).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub address: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl PartialEq for Frame {
    fn eq(&self, o: &Frame) -> bool {
        (&self.function, &self.library, &self.source) == (&o.function, &o.library, &o.source)
    }
}

impl Eq for Frame {}

impl std::hash::Hash for Frame {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (&self.function, &self.library, &self.source).hash(h);
    }
}

impl Frame {
    /// A frame with no source line and no address.
    pub fn new(function: impl Into<String>, library: impl Into<String>) -> Frame {
        Frame {
            function: function.into(),
            library: library.into(),
            ..Frame::default()
        }
    }

    /// The frame found at `address`.
    fn at(address: u64, function: impl Into<String>, library: impl Into<String>) -> Frame {
        Frame {
            address,
            ..Frame::new(function, library)
        }
    }

    /// A Python frame: `function` at `file:line`.
    pub fn python(function: &str, file: &str, line: u32) -> Frame {
        Frame {
            source: format!("{file}:{line}"),
            ..Frame::new(function, PYTHON)
        }
    }

    /// Whether this is a Python frame a sample carried.
    pub fn is_python(&self) -> bool {
        self.library == PYTHON
    }

    /// Where the frame is, shortly: a Python frame's file name and line
    /// (`app.py:23`), else its library.
    pub fn place(&self) -> String {
        match self.file_line() {
            Some((file, line)) if self.is_python() => {
                format!("{}:{line}", file.rsplit('/').next().unwrap_or(file))
            }
            _ => self.library.clone(),
        }
    }

    /// `source` as its file and line; `None` without one.
    pub fn file_line(&self) -> Option<(&str, u32)> {
        let (file, line) = self.source.rsplit_once(':')?;
        Some((file, line.parse().ok()?))
    }
}

/// Symbolizes the addresses of one process.
pub struct Symbolizer {
    /// The process's pid here (its `/proc` entry), while it runs.
    pid: Option<i32>,
    /// The process's pid as it sees itself (its perf map's name).
    own_pid: Option<i32>,
    root: String,
    maps: Vec<Mapping>,
    /// blazesym's, which keeps each file it opened (mapped, not read: a
    /// 450 MB libtorch_cpu.so costs only the pages a lookup touches).
    blaze: blazesym::symbolize::Symbolizer,
    /// The path each mapped file is read at: the process's own mapping of
    /// it (`/proc/PID/map_files`), else in the process's root, else as
    /// given; `None` if none opens.
    paths: HashMap<String, Option<String>>,
    /// The perf map's (start, size, name), sorted; read on first need.
    perf: Option<Vec<(u64, u64, String)>>,
    /// Files found at the path the process mapped but with another build
    /// id than the process's: their frames are left unnamed.
    mismatched: Vec<String>,
    /// The separate debug files of a process in another root.
    foreign: Option<ForeignDebug>,
}

/// The index of the mapping in `maps` (sorted by start, not overlapping)
/// that holds `addr`, if one does.
pub fn holding(maps: &[Mapping], addr: u64) -> Option<usize> {
    let i = maps.partition_point(|m| m.start <= addr).checked_sub(1)?;
    (addr < maps[i].end).then_some(i)
}

/// What `/proc/PID/maps` adds to the path of a file deleted (or replaced)
/// since it was mapped.
const DELETED: &str = " (deleted)";

/// The library a perf map's functions are shown in.
pub const PERF_MAP: &str = "[perf map]";

/// The library of a Python frame that a sample carried (its file and line
/// are its `source`).
pub const PYTHON: &str = "[python]";

/// Where separate debug files are looked for, under the process's root and
/// then this machine's (blazesym searches each one's `.build-id`, and the
/// debug link's name in it). Under a root that is not this machine's, by
/// build id only ([`ForeignDebug`]).
const DEBUG_DIRS: &[&str] = &["/usr/lib/debug", "/lib/debug"];

/// The separate debug files, found by build id, of a process whose root is
/// not memshim-ctl's (a container's files, which its user may have made a
/// FIFO or a device): each one that is a regular file is held open, and
/// blazesym finds it by a link, in a directory of memshim-ctl's own, to
/// that descriptor. The directory goes with the symbolizer.
struct ForeignDebug {
    dir: PathBuf,
    held: Vec<File>,
}

impl ForeignDebug {
    /// A private directory, or `None` (the container's debug files are
    /// then not used).
    fn new(pid: i32) -> Option<ForeignDebug> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!(
            "memshim-ctl-debug-{}-{pid}-{nanos:x}",
            std::process::id()
        ));
        std::fs::DirBuilder::new().mode(0o700).create(&dir).ok()?;
        Some(ForeignDebug {
            dir,
            held: Vec::new(),
        })
    }

    /// The directories blazesym searches in place of the root's.
    fn dirs(&self) -> impl Iterator<Item = String> + '_ {
        DEBUG_DIRS
            .iter()
            .map(|d| format!("{}{d}", self.dir.display()))
    }

    /// Links the debug files of build id `id` (hex) under `root`.
    fn add(&mut self, root: &str, id: &str) {
        // blazesym looks up build ids of 8 bytes or more.
        if id.len() < 16 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return;
        }
        let (head, rest) = id.split_at(2);
        for d in DEBUG_DIRS {
            let name = format!("{d}/.build-id/{head}/{rest}.debug");
            let Ok(f) = untrusted::open_regular(format!("{root}{name}").as_ref(), Links::Follow)
            else {
                continue;
            };
            let link = PathBuf::from(format!("{}{name}", self.dir.display()));
            let made = link
                .parent()
                .is_some_and(|p| std::fs::DirBuilder::new().recursive(true).create(p).is_ok())
                && std::os::unix::fs::symlink(format!("/proc/self/fd/{}", f.as_raw_fd()), &link)
                    .is_ok();
            if made {
                self.held.push(f);
            }
        }
    }
}

impl Drop for ForeignDebug {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether `/proc/PID/root` shows what memshim-ctl's `/` shows: the same
/// root in the same mount namespace.
fn same_root(root: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    let id = |p: &str| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let ns = root.strip_suffix("/root").map(|p| format!("{p}/ns/mnt"));
    id(&format!("{root}/")).is_some_and(|r| Some(r) == id("/"))
        && ns.is_some_and(|ns| id(&ns).is_some_and(|n| Some(n) == id("/proc/self/ns/mnt")))
}

impl Symbolizer {
    /// For the process `pid` (files read through `/proc/PID/root`), which
    /// sees itself as `own_pid` (`procfs::Proc::nspid`).
    pub fn new(pid: Option<(i32, i32)>, mut maps: Vec<Mapping>) -> Symbolizer {
        maps.sort_by_key(|m| m.start);
        let root = pid
            .map(|p| format!("/proc/{}/root", p.0))
            .unwrap_or_default();
        // A process in this machine's root reads this machine's debug files.
        let foreign = pid
            .filter(|_| !same_root(&root))
            .and_then(|p| ForeignDebug::new(p.0));
        let mut debug_dirs: Vec<String> = Vec::new();
        if let Some(f) = &foreign {
            debug_dirs.extend(f.dirs());
        }
        debug_dirs.extend(DEBUG_DIRS.iter().map(|d| d.to_string()));
        let blaze = blazesym::symbolize::Symbolizer::builder()
            // demangle() below: names without parameters or templates.
            .enable_demangling(false)
            .enable_code_info(true)
            .enable_inlined_fns(true)
            .set_debug_dirs(Some(debug_dirs))
            .build();
        Symbolizer {
            pid: pid.map(|p| p.0),
            own_pid: pid.map(|p| p.1),
            root,
            maps,
            blaze,
            paths: HashMap::new(),
            perf: None,
            mismatched: Vec::new(),
            foreign,
        }
    }

    /// The process's executable mappings, by address.
    pub fn maps(&self) -> &[Mapping] {
        &self.maps
    }

    /// One line per file whose frames were left unnamed because the file at
    /// the process's path is not the one it mapped (another build id).
    pub fn mismatched(&self) -> &[String] {
        &self.mismatched
    }

    /// The frames of a return address (looked up one byte before it,
    /// inside the call instruction), innermost first: the functions
    /// inlined there, then the function that holds the code.
    pub fn frames(&mut self, addr: u64) -> Vec<Frame> {
        let pc = addr.saturating_sub(1);
        let Some(m) = holding(&self.maps, pc).map(|i| &self.maps[i]) else {
            if let Some(name) = self.perf_map(pc) {
                return vec![Frame::at(pc, name, PERF_MAP)];
            }
            return vec![Frame::at(pc, format!("{addr:#x}"), "?")];
        };
        let file_off = pc - m.start + m.offset;
        // A file deleted or replaced since it was mapped (an upgrade under
        // a running server): the maps line says so after its path.
        let (path, deleted) = match m.path.strip_suffix(DELETED) {
            Some(p) => (p.to_string(), true),
            None => (m.path.clone(), false),
        };
        let library = path.rsplit('/').next().unwrap_or(&path).to_string();
        let unknown = || vec![Frame::at(pc, format!("{library}+{file_off:#x}"), &library)];
        let mapped = self
            .pid
            .map(|pid| format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end));
        let root = self.root.clone();
        let build_id = m.build_id.clone();
        let mismatched = &mut self.mismatched;
        let foreign = &mut self.foreign;
        let Some(read_at) = self
            .paths
            .entry(m.path.clone())
            .or_insert_with(|| {
                // The very file the process mapped, while it runs (root, or
                // CAP_CHECKPOINT_RESTORE); else the file at that path now,
                // unless the process's own was deleted, or the file there
                // has another build id than the process's: another file
                // there would give another file's names.
                let regular = |p: &str| untrusted::open_regular(p.as_ref(), Links::Follow).is_ok();
                if let Some(f) = foreign {
                    f.add(&root, &build_id);
                }
                if let Some(p) = mapped.filter(|p| regular(p)) {
                    return Some(p);
                }
                let by_path = (!deleted).then(|| [format!("{root}{path}"), path.clone()]);
                let mut other = None;
                let found = by_path.into_iter().flatten().find(|p| {
                    if !regular(p) {
                        return false;
                    }
                    match file_build_id(p) {
                        Some(id) if !build_id.is_empty() && id != build_id => {
                            other.get_or_insert(id);
                            false
                        }
                        _ => true,
                    }
                });
                if let (None, Some(other)) = (&found, other) {
                    mismatched.push(format!(
                        "{path}: the file there has build id {other}, the process mapped {build_id}"
                    ));
                }
                found
            })
            .clone()
        else {
            return unknown();
        };
        // The function's name from the symbol table: DWARF names a
        // function by its short name (`empty`, not `at::native::empty`);
        // its lines and inlined calls from DWARF, where there is some.
        let mut symtab = Elf::new(&read_at);
        symtab.debug_syms = false;
        let name = match self
            .blaze
            .symbolize_single(&Source::Elf(symtab), Input::FileOffset(file_off))
        {
            Ok(Symbolized::Sym(sym)) => Some(sym.name.into_owned()),
            _ => None,
        };
        let Ok(Symbolized::Sym(sym)) = self
            .blaze
            .symbolize_single(&Source::Elf(Elf::new(read_at)), Input::FileOffset(file_off))
        else {
            return match name {
                Some(name) => vec![Frame::at(pc, demangle(&name), library)],
                None => unknown(),
            };
        };
        // blazesym lists the inlined calls outermost first, each with the
        // line inside it; the function itself has the line of the first.
        let mut frames: Vec<Frame> = sym
            .inlined
            .iter()
            .rev()
            .map(|f| Frame {
                function: demangle(&f.name),
                library: library.clone(),
                source: source_line(f.code_info.as_ref()),
                address: pc,
            })
            .collect();
        frames.push(Frame {
            function: demangle(name.as_deref().unwrap_or(&sym.name)),
            library,
            source: source_line(sym.code_info.as_deref()),
            address: pc,
        });
        frames
    }
}

/// The build id of the ELF file at `path`, in lowercase hex; `None` if it
/// has none or is not one.
fn file_build_id(path: &str) -> Option<String> {
    let id = blazesym::helper::read_elf_build_id(path).ok()??;
    Some(id.iter().map(|b| format!("{b:02x}")).collect())
}

/// `file:line` (the file's name without its directory), or empty.
fn source_line(info: Option<&CodeInfo<'_>>) -> String {
    match info {
        Some(CodeInfo {
            file,
            line: Some(line),
            ..
        }) => {
            let file = file.to_string_lossy();
            let name = file.rsplit('/').next().unwrap_or(&file);
            format!("{name}:{line}")
        }
        _ => String::new(),
    }
}

impl Symbolizer {
    /// The perf map's name for `pc`, if the process has a perf map.
    fn perf_map(&mut self, pc: u64) -> Option<String> {
        let own = self.own_pid?;
        let root = self.root.clone();
        let map = self.perf.get_or_insert_with(|| read_perf_map(&root, own));
        let i = map.partition_point(|e| e.0 <= pc).checked_sub(1)?;
        let (start, size, name) = &map[i];
        (pc < start + size).then(|| name.clone())
    }
}

/// The largest perf map read (a line per compiled function).
const PERF_MAP_LIMIT: u64 = 256 << 20;

/// `/tmp/perf-<own>.map` (`own`: the pid as the process sees itself),
/// read through its root.
fn read_perf_map(root: &str, own: i32) -> Vec<(u64, u64, String)> {
    let path = format!("{root}/tmp/perf-{own}.map");
    let text = untrusted::read_regular_text(path.as_ref(), Links::Follow, PERF_MAP_LIMIT)
        .unwrap_or_default();
    let mut v: Vec<(u64, u64, String)> = text
        .lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ' ');
            let start = u64::from_str_radix(it.next()?, 16).ok()?;
            let size = u64::from_str_radix(it.next()?, 16).ok()?;
            Some((start, size, it.next()?.to_string()))
        })
        .collect();
    v.sort_by_key(|e| e.0);
    v
}

/// A mangled name to its qualified name, without parameters, return type or
/// template arguments: `_ZN2at6native5emptyEv` is `at::native::empty`.
/// Rust names (legacy `_ZN...17h<hash>E` and v0 `_R...`) by rustc-demangle,
/// without their hash; Itanium C++ names by cpp_demangle. Other names, and
/// names neither library reads, are returned as they are.
pub fn demangle(name: &str) -> String {
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        // `{:#}` leaves the hash out.
        return format!("{d:#}");
    }
    if !name.starts_with("_Z") {
        return name.to_string();
    }
    let opts = cpp_demangle::DemangleOptions::new()
        .no_params()
        .no_return_type();
    match cpp_demangle::Symbol::new(name)
        .ok()
        .and_then(|s| s.demangle_with_options(&opts).ok())
    {
        Some(d) => without_template_args(d.trim_end_matches(" const")),
        None => name.to_string(),
    }
}

/// `std::vector<int, std::allocator<int> >::size` to `std::vector::size`:
/// every balanced `<...>` removed, but the `<` and `>` of an operator's name
/// (`operator<<`, `operator->`).
fn without_template_args(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut depth = 0usize;
    let mut rest = s;
    while let Some(c) = rest.chars().next() {
        if depth == 0 && rest.starts_with("operator") {
            let op_len = "operator".len()
                + rest["operator".len()..]
                    .chars()
                    .take_while(|c| "<>=-!+*/%&|^~[]()".contains(*c))
                    .map(char::len_utf8)
                    .sum::<usize>();
            out.push_str(&rest[..op_len]);
            rest = &rest[op_len..];
            continue;
        }
        match c {
            '<' => depth += 1,
            '>' if depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
        rest = &rest[c.len_utf8()..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mangled_names_read_as_their_qualified_name() {
        // The last five are what the hand-written reader did not read:
        // substitutions, nested templates, operators, Rust's v0 mangling.
        let cases = [
            (
                "_ZN2at6native5emptyEN3c108ArrayRefIlEE",
                "at::native::empty",
            ),
            ("_Z15keep_sixty_fourv", "keep_sixty_four"),
            ("_ZN3foo3barIiE3bazEv", "foo::bar::baz"),
            ("_ZNKSt6vectorIiSaIiEE4sizeEv", "std::vector::size"),
            ("_ZN4core3fmt5write17h0123456789abcdefE", "core::fmt::write"),
            ("_ZN3FooC2Ev", "Foo::Foo"),
            ("_ZN3FooD1Ev", "Foo::~Foo"),
            ("PyList_Append", "PyList_Append"),
            ("_Zbroken", "_Zbroken"),
            (
                "_ZN3c1010TensorImpl7releaseERKSt10shared_ptrIS0_E",
                "c10::TensorImpl::release",
            ),
            (
                "_ZNSt6vectorISt4pairIiiESaIS1_EE9push_backEOS1_",
                "std::vector::push_back",
            ),
            ("_ZlsRSoRK3Foo", "operator<<"),
            ("_RNvNtCs1234_7mycrate3foo3bar", "mycrate::foo::bar"),
        ];
        for (mangled, name) in cases {
            assert_eq!(demangle(mangled), name, "{mangled}");
        }
    }

    #[test]
    fn this_test_binary_symbolizes_its_own_function() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let maps: Vec<Mapping> = maps
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let (s, e) = f[0].split_once('-')?;
                (f.len() >= 6 && f[1].contains('x') && f[5].starts_with('/')).then(|| Mapping {
                    start: u64::from_str_radix(s, 16).unwrap(),
                    end: u64::from_str_radix(e, 16).unwrap(),
                    offset: u64::from_str_radix(f[2], 16).unwrap(),
                    path: f[5..].join(" "),
                    build_id: String::new(),
                })
            })
            .collect();
        let mut s = Symbolizer::new(None, maps);
        let addr = demangle as *const () as u64 + 1;
        let frames = s.frames(addr);
        let f = frames.last().unwrap();
        assert!(f.function.ends_with("symbols::demangle"), "{frames:?}");
        assert!(f.library.starts_with("memshim_ctl"), "{f:?}");
    }

    /// A C file built with `-O2 -g` into `dir`, where `f` inlines `g`,
    /// which inlines `h`, which calls `malloc`: the executable, mapped
    /// whole at 0x10000 (a PIE's first segments have file offsets equal to
    /// their addresses), and the return address of that call (or tail
    /// jump) there.
    fn inlining_program(dir: &std::path::Path) -> (Mapping, u64) {
        std::fs::create_dir_all(dir).unwrap();
        let (src, exe) = (dir.join("inl.c"), dir.join("inl"));
        std::fs::write(
            &src,
            "#include <stdlib.h>\n\
             static inline __attribute__((always_inline)) void *h(size_t n) {\n\
             return malloc(n);\n\
             }\n\
             static inline __attribute__((always_inline)) void *g(size_t n) {\n\
             return h(n * 2);\n\
             }\n\
             __attribute__((noinline)) void *f(size_t n) {\n\
             return g(n + 1);\n\
             }\n\
             int main(int c, char **v) { (void)v; return f(c) == 0; }\n",
        )
        .unwrap();
        let cc = std::process::Command::new("cc")
            .args(["-O2", "-g", "-Wl,--build-id", "-o"])
            .arg(&exe)
            .arg(&src)
            .status()
            .unwrap();
        assert!(cc.success());
        let dis = std::process::Command::new("objdump")
            .arg("-d")
            .arg(&exe)
            .output()
            .unwrap();
        let dis = String::from_utf8_lossy(&dis.stdout);
        let body = dis.split("<f>:\n").nth(1).unwrap();
        let call = body
            .lines()
            .find(|l| l.contains("malloc"))
            .unwrap_or_else(|| panic!("no call to malloc in f: {body}"));
        let vaddr = u64::from_str_radix(call.trim().split(':').next().unwrap(), 16).unwrap();
        let len = std::fs::metadata(&exe).unwrap().len();
        let map = Mapping {
            start: 0x10000,
            end: 0x10000 + len,
            offset: 0,
            path: exe.display().to_string(),
            build_id: String::new(),
        };
        (map, 0x10000 + vaddr + 1)
    }

    /// The call's address is three frames, each with its own line,
    /// innermost first (what the hand-written reader, with symbol tables
    /// only, gave as `f` alone), all at the address looked up.
    #[test]
    fn dwarf_gives_inlined_functions_and_source_lines() {
        let dir = std::env::temp_dir().join(format!("memshim-symbols-{}", std::process::id()));
        let (map, ret) = inlining_program(&dir);
        let mut s = Symbolizer::new(None, vec![map]);
        let frames = s.frames(ret);
        let got: Vec<(&str, &str)> = frames
            .iter()
            .map(|f| (f.function.as_str(), f.source.as_str()))
            .collect();
        assert_eq!(
            got,
            [("h", "inl.c:3"), ("g", "inl.c:6"), ("f", "inl.c:9")],
            "{frames:?}"
        );
        assert!(frames.iter().all(|f| f.library == "inl"), "{frames:?}");
        assert!(frames.iter().all(|f| f.address == ret - 1), "{frames:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A file read at the process's path is used only if its build id is
    /// the one the process sent: another file there (a rebuilt library)
    /// would give its own names to the process's addresses.
    #[test]
    fn a_file_with_another_build_id_than_the_process_s_is_not_read() {
        let dir = std::env::temp_dir().join(format!("memshim-buildid-{}", std::process::id()));
        let (map, ret) = inlining_program(&dir);
        let id = file_build_id(&map.path).expect("cc -Wl,--build-id wrote a build id");
        assert_eq!(id.len(), 40, "{id}");
        let named = |build_id: &str| {
            let mut s = Symbolizer::new(
                None,
                vec![Mapping {
                    build_id: build_id.into(),
                    ..map.clone()
                }],
            );
            let f = s.frames(ret).last().unwrap().function.clone();
            (f, s.mismatched().to_vec())
        };
        assert_eq!(named(&id), ("f".to_string(), vec![]));
        assert_eq!(named("").0, "f", "no build id sent: the path is trusted");
        let other = "ab".repeat(20);
        let (f, mismatched) = named(&other);
        assert!(f.starts_with("inl+0x"), "{f}");
        assert_eq!(mismatched.len(), 1);
        assert!(
            mismatched[0].contains(&id) && mismatched[0].contains(&other),
            "{mismatched:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
