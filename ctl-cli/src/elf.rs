//! Just enough ELF to tell why `LD_PRELOAD` cannot work for an executable
//! (`doctor`): its class and machine, whether it has a program interpreter
//! (dynamic) and which, and whether it defines `malloc` itself; and whether
//! a file ld.so is asked to preload is a shared library (`run`).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// What `doctor` needs to know about an executable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfFacts {
    /// 32 or 64.
    pub bits: u8,
    /// `e_machine`.
    pub machine: u16,
    /// A shared library: `ET_DYN`, and not a position-independent
    /// executable (`DF_1_PIE` in `DT_FLAGS_1`), which ld.so will not load
    /// ("cannot dynamically load position-independent executable").
    pub shared_library: bool,
    /// The `PT_INTERP` path; `None` for a static executable.
    pub interp: Option<String>,
    /// `.dynsym` defines `malloc` (the executable brings its own allocator;
    /// it precedes every preload in symbol lookup).
    pub defines_malloc: bool,
    /// `.dynsym` defines a sanitizer runtime entry (`__asan_init`, ...):
    /// a statically linked sanitizer, which must own malloc.
    pub sanitizer: Option<String>,
}

const SANITIZERS: [&str; 4] = ["__asan_init", "__tsan_init", "__msan_init", "__hwasan_init"];

/// Bytes at `off`, or an error naming what was short.
fn read(f: &File, off: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut b = vec![0; len];
    f.read_exact_at(&mut b, off)?;
    Ok(b)
}

fn u16le(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn u32le(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
fn u64le(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

/// Reads the facts of the ELF file at `path`; `Err` with a reason if it is
/// not a little-endian ELF file this code understands.
pub fn inspect(path: &Path) -> Result<ElfFacts, String> {
    let f = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let bad = |what: &str| format!("{}: {what}", path.display());
    let h = read(&f, 0, 64).map_err(|_| bad("too short for an ELF header"))?;
    if &h[..4] != b"\x7fELF" {
        return Err(bad("not an ELF file (a script?)"));
    }
    let bits = match h[4] {
        1 => 32,
        2 => 64,
        _ => return Err(bad("unknown ELF class")),
    };
    if h[5] != 1 {
        return Err(bad("big-endian ELF"));
    }
    let machine = u16le(&h, 18);
    let (phoff, shoff, phentsize, phnum, shentsize, shnum) = if bits == 64 {
        (
            u64le(&h, 32),
            u64le(&h, 40),
            u16le(&h, 54),
            u16le(&h, 56),
            u16le(&h, 58),
            u16le(&h, 60),
        )
    } else {
        (
            u32le(&h, 28) as u64,
            u32le(&h, 32) as u64,
            u16le(&h, 42),
            u16le(&h, 44),
            u16le(&h, 46),
            u16le(&h, 48),
        )
    };

    let mut interp = None;
    let mut pie = false;
    let ph = read(&f, phoff, phentsize as usize * phnum as usize)
        .map_err(|_| bad("truncated program headers"))?;
    for i in 0..phnum as usize {
        let p = &ph[i * phentsize as usize..];
        if u32le(p, 0) == 2 {
            // PT_DYNAMIC: DT_FLAGS_1 (0x6ffffffb) with DF_1_PIE (0x08000000).
            let (off, size, word) = if bits == 64 {
                (u64le(p, 8), u64le(p, 32), 8)
            } else {
                (u32le(p, 4) as u64, u32le(p, 16) as u64, 4)
            };
            let d = read(&f, off, size.min(1 << 16) as usize)
                .map_err(|_| bad("truncated PT_DYNAMIC"))?;
            let value = |b: &[u8]| {
                if word == 8 {
                    u64le(b, 0)
                } else {
                    u32le(b, 0) as u64
                }
            };
            for e in d.chunks_exact(2 * word) {
                match value(e) {
                    0 => break,
                    0x6fff_fffb => pie |= value(&e[word..]) & 0x0800_0000 != 0,
                    _ => {}
                }
            }
        }
        if u32le(p, 0) == 3 {
            // PT_INTERP
            let (off, size) = if bits == 64 {
                (u64le(p, 8), u64le(p, 32))
            } else {
                (u32le(p, 4) as u64, u32le(p, 16) as u64)
            };
            let s =
                read(&f, off, size.min(4096) as usize).map_err(|_| bad("truncated PT_INTERP"))?;
            interp = Some(
                String::from_utf8_lossy(s.split(|b| *b == 0).next().unwrap_or(&[])).into_owned(),
            );
        }
    }

    let (defines_malloc, sanitizer) = if shoff == 0 || shnum == 0 {
        (false, None)
    } else {
        let sh = read(&f, shoff, shentsize as usize * shnum as usize)
            .map_err(|_| bad("truncated section headers"))?;
        let sec = |i: usize| &sh[i * shentsize as usize..(i + 1) * shentsize as usize];
        // (offset, size, link, entsize) of a section header.
        let fields = |s: &[u8]| {
            if bits == 64 {
                (u64le(s, 24), u64le(s, 32), u32le(s, 40), u64le(s, 56))
            } else {
                (
                    u32le(s, 16) as u64,
                    u32le(s, 20) as u64,
                    u32le(s, 24),
                    u32le(s, 36) as u64,
                )
            }
        };
        let mut found = false;
        let mut san = None;
        for i in 0..shnum as usize {
            if u32le(sec(i), 4) != 11 {
                continue; // not SHT_DYNSYM
            }
            let (off, size, link, ent) = fields(sec(i));
            if ent == 0 || link as usize >= shnum as usize || size > 64 << 20 {
                continue;
            }
            let (stroff, strsize, _, _) = fields(sec(link as usize));
            let syms = read(&f, off, size as usize).map_err(|_| bad("truncated .dynsym"))?;
            let strs = read(&f, stroff, strsize.min(64 << 20) as usize)
                .map_err(|_| bad("truncated .dynstr"))?;
            for s in syms.chunks_exact(ent as usize) {
                let name = u32le(s, 0) as usize;
                let shndx = if bits == 64 {
                    u16le(s, 6)
                } else {
                    u16le(s, 14)
                };
                if shndx == 0 {
                    continue;
                }
                let sym = strs
                    .get(name..)
                    .and_then(|t| t.split(|b| *b == 0).next())
                    .unwrap_or(&[]);
                if sym == b"malloc" {
                    found = true;
                }
                if let Some(s) = SANITIZERS.iter().find(|s| s.as_bytes() == sym) {
                    san = Some(s.to_string());
                }
            }
        }
        (found, san)
    };
    Ok(ElfFacts {
        bits,
        machine,
        shared_library: u16le(&h, 16) == 3 && !pie,
        interp,
        defines_malloc,
        sanitizer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_test_binary_and_a_shell() {
        let me = inspect(&std::env::current_exe().unwrap()).unwrap();
        assert_eq!(me.bits, 64);
        assert!(
            me.interp.as_deref().unwrap_or("").contains("ld-linux"),
            "{me:?}"
        );
        let sh = inspect(Path::new("/bin/sh")).unwrap();
        assert!(!sh.defines_malloc, "{sh:?}");
        assert!(inspect(Path::new("/etc/hostname")).is_err());
    }

    #[test]
    fn reads_a_32_bit_header_with_an_interpreter() {
        // ELF32 little-endian i386 executable: header, one PT_INTERP entry,
        // the interpreter string; no section headers.
        let mut f = vec![0u8; 52 + 32];
        f[..7].copy_from_slice(b"\x7fELF\x01\x01\x01");
        f[18..20].copy_from_slice(&3u16.to_le_bytes()); // EM_386
        f[28..32].copy_from_slice(&52u32.to_le_bytes()); // e_phoff
        f[42..44].copy_from_slice(&32u16.to_le_bytes()); // e_phentsize
        f[44..46].copy_from_slice(&1u16.to_le_bytes()); // e_phnum
        let interp = b"/lib/ld-linux.so.2\0";
        f[52..56].copy_from_slice(&3u32.to_le_bytes()); // PT_INTERP
        f[56..60].copy_from_slice(&84u32.to_le_bytes()); // p_offset
        f[68..72].copy_from_slice(&(interp.len() as u32).to_le_bytes()); // p_filesz
        f.extend_from_slice(interp);
        let path = std::env::temp_dir().join(format!("memshim-elf32-{}", std::process::id()));
        std::fs::write(&path, &f).unwrap();
        let e = inspect(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            (e.bits, e.machine, e.interp.as_deref(), e.defines_malloc),
            (32, 3, Some("/lib/ld-linux.so.2"), false)
        );
    }
}
