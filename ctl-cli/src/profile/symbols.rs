//! Addresses of another process to function names, for `profile`.
//!
//! The process sends its executable file mappings with the profile; each
//! file is read here (through `/proc/PID/root`, so a container's files are
//! its own, falling back to the path as given), its ELF symbol tables
//! (`.symtab` where the file was not stripped, `.dynsym` always) give the
//! functions, and an address is placed in the load segment it falls in.
//! 64-bit little-endian ELF only (x86_64, aarch64). A function that has no
//! symbol is shown as `library+0xoffset`.
//!
//! C++ and Rust names are shown by [`demangle`]: the qualified name only,
//! without parameter types or template arguments, which is what a profile
//! table has room for.
//!
//! Code that is in no file (a JIT's) is looked up in the process's perf map,
//! `/tmp/perf-<pid>.map` (pid as the process sees itself), where CPython
//! 3.12+ run with `-X perf` names each Python function's trampoline
//! `py::<function>:<file>`.

use memshim_proto::Mapping;
use std::collections::HashMap;

/// Where an address is: its function (if a symbol covers it) and its file.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Frame {
    /// The function's name, demangled; `lib+0x..` when there is no symbol.
    pub function: String,
    /// The file's name without its directory (`libtorch_cpu.so`).
    pub library: String,
}

/// One ELF file's functions and load segments. Names stay in the file
/// until a lookup needs one.
struct Elf {
    file: ElfFile,
    /// (start, size, file offset of the NUL-terminated name), sorted by
    /// start.
    funcs: Vec<(u64, u64, u64)>,
    /// (file offset, vaddr, file size) of each PT_LOAD.
    loads: Vec<(u64, u64, u64)>,
}

/// Symbolizes the addresses of one process.
pub struct Symbolizer {
    /// The process's pid as it sees itself (its perf map's name).
    own_pid: Option<i32>,
    root: String,
    maps: Vec<Mapping>,
    files: HashMap<String, Option<Elf>>,
    /// The perf map's (start, size, name), sorted; read on first need.
    perf: Option<Vec<(u64, u64, String)>>,
}

/// The library a perf map's functions are shown in.
pub const PERF_MAP: &str = "[perf map]";

impl Symbolizer {
    /// For the process `pid` (files read through `/proc/PID/root`), which
    /// sees itself as `own_pid` (`procfs::Proc::nspid`).
    pub fn new(pid: Option<(i32, i32)>, mut maps: Vec<Mapping>) -> Symbolizer {
        maps.sort_by_key(|m| m.start);
        Symbolizer {
            own_pid: pid.map(|p| p.1),
            root: pid
                .map(|p| format!("/proc/{}/root", p.0))
                .unwrap_or_default(),
            maps,
            files: HashMap::new(),
            perf: None,
        }
    }

    /// The frame of a return address (looked up one byte before it, inside
    /// the call instruction).
    pub fn frame(&mut self, addr: u64) -> Frame {
        let pc = addr.saturating_sub(1);
        let i = self.maps.partition_point(|m| m.start <= pc);
        let Some(m) = i
            .checked_sub(1)
            .map(|i| &self.maps[i])
            .filter(|m| pc < m.end)
        else {
            if let Some(name) = self.perf_map(pc) {
                return Frame {
                    function: name,
                    library: PERF_MAP.into(),
                };
            }
            return Frame {
                function: format!("{addr:#x}"),
                library: "?".into(),
            };
        };
        let (path, file_off) = (m.path.clone(), pc - m.start + m.offset);
        let library = path.rsplit('/').next().unwrap_or(&path).to_string();
        let root = self.root.clone();
        let elf = self
            .files
            .entry(path.clone())
            .or_insert_with(|| read_elf(&root, &path));
        let function = elf
            .as_ref()
            .and_then(|e| e.function(file_off))
            .map(|n| demangle(&n))
            .unwrap_or_else(|| format!("{library}+{file_off:#x}"));
        Frame { function, library }
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

/// `/tmp/perf-<own>.map` (`own`: the pid as the process sees itself),
/// read through its root.
fn read_perf_map(root: &str, own: i32) -> Vec<(u64, u64, String)> {
    let text = std::fs::read_to_string(format!("{root}/tmp/perf-{own}.map")).unwrap_or_default();
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

impl Elf {
    fn function(&self, file_off: u64) -> Option<String> {
        let &(off, vaddr, _) = self
            .loads
            .iter()
            .find(|&&(off, _, size)| file_off >= off && file_off < off + size)?;
        let v = file_off - off + vaddr;
        let i = self.funcs.partition_point(|f| f.0 <= v).checked_sub(1)?;
        let &(start, size, name) = &self.funcs[i];
        // A symbol of size 0 (hand-written assembly) covers up to the next.
        if size != 0 && v >= start + size {
            return None;
        }
        self.file.c_string(name)
    }
}

fn read_elf(root: &str, path: &str) -> Option<Elf> {
    let file = std::fs::File::open(format!("{root}{path}"))
        .or_else(|_| std::fs::File::open(path))
        .ok()?;
    parse_elf(ElfFile(file))
}

/// An ELF file read piece by piece: its headers and symbol tables, then
/// only the names a lookup finds, never the whole file (libtorch_cpu.so is
/// 450 MB with a 78 MB string table; reading it whole made `profile` of a
/// BERT take half a gigabyte).
struct ElfFile(std::fs::File);

impl ElfFile {
    /// `len` bytes at `off`; `None` past the end (a truncated or odd file)
    /// or for a length no ELF table has (over 1 GiB).
    fn read(&self, off: u64, len: u64) -> Option<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        if len > 1 << 30 {
            return None;
        }
        let mut buf = vec![0u8; len as usize];
        self.0.read_exact_at(&mut buf, off).ok()?;
        Some(buf)
    }

    /// The NUL-terminated string at `off` (a symbol's name: C++ names run
    /// to kilobytes), at most 64 KiB of it.
    fn c_string(&self, off: u64) -> Option<String> {
        use std::os::unix::fs::FileExt;
        let mut name = Vec::new();
        let mut chunk = [0u8; 512];
        while name.len() < 64 << 10 {
            let n = self.0.read_at(&mut chunk, off + name.len() as u64).ok()?;
            if n == 0 {
                break;
            }
            match chunk[..n].iter().position(|&c| c == 0) {
                Some(end) => {
                    name.extend_from_slice(&chunk[..end]);
                    break;
                }
                None => name.extend_from_slice(&chunk[..n]),
            }
        }
        (!name.is_empty()).then(|| String::from_utf8_lossy(&name).into_owned())
    }
}

fn u16_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from(u16::from_le_bytes(
        b.get(o..o + 2)?.try_into().ok()?,
    )))
}
fn u32_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from(u32::from_le_bytes(
        b.get(o..o + 4)?.try_into().ok()?,
    )))
}
fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

/// The functions and load segments of a 64-bit little-endian ELF file.
fn parse_elf(f: ElfFile) -> Option<Elf> {
    let h = f.read(0, 64)?;
    if h.get(0..4)? != b"\x7fELF" || *h.get(4)? != 2 || *h.get(5)? != 1 {
        return None;
    }
    let (phoff, shoff) = (u64_at(&h, 0x20)?, u64_at(&h, 0x28)?);
    let (phentsize, phnum) = (u16_at(&h, 0x36)?, u16_at(&h, 0x38)?);
    let (shentsize, shnum) = (u16_at(&h, 0x3a)?, u16_at(&h, 0x3c)?);
    let ph = f.read(phoff, phentsize * phnum)?;
    let mut loads = Vec::new();
    for i in 0..phnum as usize {
        let p = i * phentsize as usize;
        if u32_at(&ph, p)? == 1 {
            // PT_LOAD: p_offset, p_vaddr, p_filesz
            loads.push((
                u64_at(&ph, p + 8)?,
                u64_at(&ph, p + 16)?,
                u64_at(&ph, p + 32)?,
            ));
        }
    }
    let sh = f.read(shoff, shentsize * shnum)?;
    let section = |i: usize| -> Option<(u64, u64, u64, usize)> {
        let s = i * shentsize as usize;
        // sh_type, sh_offset, sh_size, sh_link
        Some((
            u32_at(&sh, s + 4)?,
            u64_at(&sh, s + 0x18)?,
            u64_at(&sh, s + 0x20)?,
            u32_at(&sh, s + 0x28)? as usize,
        ))
    };
    let mut funcs = Vec::new();
    for i in 0..shnum as usize {
        let (kind, off, size, link) = section(i)?;
        // SHT_SYMTAB (2) or SHT_DYNSYM (11), with their string table.
        if kind != 2 && kind != 11 {
            continue;
        }
        let (_, str_off, str_size, _) = section(link)?;
        let syms = f.read(off, size - size % 24)?;
        for e in syms.chunks_exact(24) {
            let info = e[4];
            let shndx = u16_at(e, 6)?;
            // STT_FUNC (2) or STT_GNU_IFUNC (10), defined.
            if !matches!(info & 0xf, 2 | 10) || shndx == 0 {
                continue;
            }
            let (value, sz) = (u64_at(e, 8)?, u64_at(e, 16)?);
            let name_off = u32_at(e, 0)?;
            // A name inside its table, and not the empty one at 0.
            if name_off != 0 && name_off < str_size {
                funcs.push((value, sz, str_off + name_off));
            }
        }
    }
    funcs.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    funcs.dedup_by_key(|f| f.0);
    Some(Elf {
        file: f,
        funcs,
        loads,
    })
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
                })
            })
            .collect();
        let mut s = Symbolizer::new(None, maps);
        let addr = demangle as *const () as u64 + 1;
        let f = s.frame(addr);
        assert!(f.function.ends_with("symbols::demangle"), "{f:?}");
        assert!(f.library.starts_with("memshim_ctl"), "{f:?}");
    }
}
