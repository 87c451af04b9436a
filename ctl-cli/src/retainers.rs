//! Caches and pools that keep memory on purpose, named when a profile
//! shows them (the footer of `profile`'s table; docs/profile.md, "Known
//! retainers"). Each is recognised by the names of the functions or
//! libraries in the stacks that hold its bytes.

use crate::heapprof::{Profile, signed_bytes};

/// One known retainer.
struct Retainer {
    /// What it is.
    name: &'static str,
    /// A stack holds its memory if a frame's function or library contains
    /// one of these (ASCII, any case).
    marks: &'static [&'static str],
    /// What bounds or returns it.
    advice: &'static str,
}

const KNOWN: &[Retainer] = &[
    Retainer {
        name: "oneDNN's primitive cache (PyTorch CPU kernels)",
        marks: &["dnnl", "mkldnn", "onednn"],
        advice: "it grows with each new input shape; ONEDNN_PRIMITIVE_CACHE_CAPACITY (default 1024) bounds it, and one report measured +592 MB -> +59 MB at the same latency with a small value",
    },
    Retainer {
        name: "Intel MKL's buffers",
        marks: &["libmkl", "mkl_serv", "mkl_blas"],
        advice: "MKL keeps its work buffers; mkl_free_buffers() returns them, MKL_DISABLE_FAST_MM=1 stops the pooling",
    },
    Retainer {
        name: "OpenMP thread pools (libgomp, libiomp)",
        marks: &["libgomp", "libiomp", "gomp_"],
        advice: "each OpenMP thread keeps its stack and work buffers for as long as the pool lives; OMP_NUM_THREADS bounds the pool",
    },
    Retainer {
        name: "PyTorch's pinned host memory cache",
        marks: &["CachingHostAllocator", "HostAllocator"],
        advice: "torch keeps freed pinned buffers for reuse; `memshim-ctl release` (empty_cache) returns them",
    },
];

/// A line for each known retainer that holds live bytes in `p`.
pub fn found(p: &Profile) -> Vec<String> {
    let mut out = Vec::new();
    for r in KNOWN {
        let held: i64 = p
            .stacks
            .iter()
            .filter(|s| {
                s.frames.iter().any(|f| {
                    r.marks
                        .iter()
                        .any(|m| contains_ci(&f.function, m) || contains_ci(&f.library, m))
                })
            })
            .map(|s| s.bytes)
            .sum();
        if held > 0 {
            out.push(format!(
                "{}: {} live here. {}.",
                r.name,
                signed_bytes(held),
                r.advice
            ));
        }
    }
    out
}

fn contains_ci(hay: &str, needle: &str) -> bool {
    hay.to_ascii_lowercase()
        .contains(&needle.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heapprof::Stack;
    use crate::symbols::Frame;

    #[test]
    fn a_retainer_is_named_only_when_it_holds_memory() {
        let frame = |f: &str, l: &str| Frame {
            function: f.into(),
            library: l.into(),
        };
        let p = Profile {
            pid: None,
            lg_sample: 19,
            bytes: 3 << 20,
            objects: 2,
            stacks: vec![
                Stack {
                    bytes: 2 << 20,
                    objects: 1,
                    frames: vec![frame(
                        "dnnl::impl::primitive_cache_t::add",
                        "libtorch_cpu.so",
                    )],
                },
                Stack {
                    bytes: 1 << 20,
                    objects: 1,
                    frames: vec![frame("main", "app")],
                },
            ],
        };
        let lines = found(&p);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].starts_with("oneDNN's primitive cache") && lines[0].contains("2.0 MiB"));
    }
}
