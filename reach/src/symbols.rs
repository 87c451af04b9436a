//! Finding a function in the target: its mapped files (`/proc/PID/maps`),
//! each file's dynamic symbol table (read through `/proc/PID/root`, so a
//! process in another mount namespace is read as it sees its files), and
//! the load bias of each.

use std::fs;
use std::path::PathBuf;

/// One ELF file mapped in the target.
#[derive(Debug, Clone)]
pub struct Object {
    /// Its path as the target sees it.
    pub path: String,
    /// The start of its mapping of file offset 0.
    pub start: u64,
    /// The end of that mapping.
    pub end: u64,
}

/// The files the target has mapped at offset 0 (one entry each, in the
/// order of the maps).
pub fn objects(pid: i32) -> std::io::Result<Vec<Object>> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let mut out: Vec<Object> = Vec::new();
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(_perm), Some(off), Some(_dev), Some(_ino)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let path: String = f.collect::<Vec<_>>().join(" ");
        if !path.starts_with('/') || path.ends_with(" (deleted)") {
            continue;
        }
        if u64::from_str_radix(off, 16).ok() != Some(0) || out.iter().any(|o| o.path == path) {
            continue;
        }
        let mut ends = range.split('-').map(|s| u64::from_str_radix(s, 16).ok());
        let (Some(Some(start)), Some(Some(end))) = (ends.next(), ends.next()) else {
            continue;
        };
        out.push(Object { path, start, end });
    }
    Ok(out)
}

/// A parsed ELF file: its lowest loaded address and its dynamic symbols.
pub struct Elf {
    /// `e_type`: 2 executable (no bias), 3 shared object or PIE.
    e_type: u16,
    /// The lowest `p_vaddr` of a `PT_LOAD`, page-aligned down.
    first_vaddr: u64,
    /// (name, value) of every defined dynamic function or object.
    syms: Vec<(Vec<u8>, u64)>,
}

fn u16le(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32le(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64le(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

impl Elf {
    /// Reads the file mapped as `o` in process `pid`: the mapping itself
    /// (`/proc/PID/map_files`, which needs CAP_SYS_ADMIN), else its path as
    /// `maps` shows it to us (from our root: a chrooted process's files
    /// have their full path here), else that path under the process's own
    /// root (another mount namespace).
    pub fn open(pid: i32, o: &Object) -> Option<Elf> {
        let tries = [
            PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", o.start, o.end)),
            PathBuf::from(&o.path),
            PathBuf::from(format!("/proc/{pid}/root{}", o.path)),
        ];
        tries
            .iter()
            .find_map(|p| fs::read(p).ok())
            .and_then(|b| Elf::parse(&b))
    }

    /// Parses an ELF64 little-endian file (x86_64).
    pub fn parse(b: &[u8]) -> Option<Elf> {
        if b.get(0..4)? != b"\x7fELF" || *b.get(4)? != 2 || *b.get(5)? != 1 {
            return None;
        }
        let e_type = u16le(b, 16)?;
        let phoff = u64le(b, 32)? as usize;
        let shoff = u64le(b, 40)? as usize;
        let phentsize = u16le(b, 54)? as usize;
        let phnum = u16le(b, 56)? as usize;
        let shentsize = u16le(b, 58)? as usize;
        let shnum = u16le(b, 60)? as usize;
        let mut first_vaddr = u64::MAX;
        for i in 0..phnum {
            let ph = phoff + i * phentsize;
            if u32le(b, ph)? == 1 {
                first_vaddr = first_vaddr.min(u64le(b, ph + 16)? & !0xfff);
            }
        }
        let mut syms = Vec::new();
        for i in 0..shnum {
            let sh = shoff + i * shentsize;
            if u32le(b, sh + 4)? != 11 {
                continue; // not SHT_DYNSYM
            }
            let off = u64le(b, sh + 24)? as usize;
            let size = u64le(b, sh + 32)? as usize;
            let link = u32le(b, sh + 40)? as usize;
            let ent = (u64le(b, sh + 56)? as usize).max(24);
            let str_sh = shoff + link * shentsize;
            let str_off = u64le(b, str_sh + 24)? as usize;
            let str_size = u64le(b, str_sh + 32)? as usize;
            let strtab = b.get(str_off..str_off + str_size)?;
            for s in (off..off + size).step_by(ent) {
                let name = u32le(b, s)? as usize;
                let info = *b.get(s + 4)?;
                let shndx = u16le(b, s + 6)?;
                let value = u64le(b, s + 8)?;
                // Defined functions and objects (not GNU indirect
                // functions: their address is the resolver's).
                if shndx == 0 || value == 0 || !matches!(info & 0xf, 1 | 2) {
                    continue;
                }
                let Some(rest) = strtab.get(name..) else {
                    continue;
                };
                let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
                syms.push((rest[..end].to_vec(), value));
            }
        }
        Some(Elf {
            e_type,
            first_vaddr: if first_vaddr == u64::MAX {
                0
            } else {
                first_vaddr
            },
            syms,
        })
    }

    /// The symbol's value (unrelocated), if this file defines it.
    pub fn symbol(&self, name: &str) -> Option<u64> {
        self.syms
            .iter()
            .find(|(n, _)| n == name.as_bytes())
            .map(|&(_, v)| v)
    }

    /// The address where `value` lies once this file is mapped at `start`.
    pub fn relocate(&self, start: u64, value: u64) -> u64 {
        if self.e_type == 2 {
            value
        } else {
            start.wrapping_sub(self.first_vaddr).wrapping_add(value)
        }
    }
}

/// The target's objects, each parsed once when first asked.
pub struct Resolver {
    pid: i32,
    objects: Vec<(Object, Option<Option<Elf>>)>,
}

impl Resolver {
    /// Reads the target's maps.
    pub fn new(pid: i32) -> std::io::Result<Resolver> {
        Ok(Resolver {
            pid,
            objects: objects(pid)?.into_iter().map(|o| (o, None)).collect(),
        })
    }

    /// The objects' paths, in the order of the maps.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.objects.iter().map(|(o, _)| o.path.as_str())
    }

    /// Whether `name` is defined by an object whose file name does not
    /// start with `libc.so` (an allocator preloaded or linked in: its
    /// `malloc` is the process's, not glibc's).
    pub fn defined_beside_libc(&mut self, name: &str) -> bool {
        let pid = self.pid;
        self.objects.iter_mut().any(|(o, elf)| {
            let file = o.path.rsplit('/').next().unwrap_or("");
            !file.starts_with("libc.so")
                && elf
                    .get_or_insert_with(|| Elf::open(pid, o))
                    .as_ref()
                    .is_some_and(|e| e.symbol(name).is_some())
        })
    }

    /// The target's address of the first definition of `name` among its
    /// objects (the executable first, as the loader searches), with the
    /// path of the file that defines it.
    pub fn find(&mut self, name: &str) -> Option<(u64, String)> {
        let pid = self.pid;
        self.objects.iter_mut().find_map(|(o, elf)| {
            let elf = elf.get_or_insert_with(|| Elf::open(pid, o)).as_ref()?;
            let v = elf.symbol(name)?;
            Some((elf.relocate(o.start, v), o.path.clone()))
        })
    }
}
