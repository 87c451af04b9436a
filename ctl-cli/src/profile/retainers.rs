//! Caches and pools that keep memory on purpose, named when a profile
//! shows them (the footer of `profile`'s table; docs/profile.md, "Known
//! retainers"). Each is recognised by the functions and libraries it owns,
//! and a byte is named once: a stack belongs to the retainer of its
//! innermost frame that one owns (the code closest to the allocation), and
//! a thread's entry frames own nothing. MKL's `mm_internal_malloc` on an
//! OpenMP worker thread is MKL's, not also the pool's whose thread it runs
//! on (issue 47).

use crate::profile::heap::{Profile, signed_bytes};
use crate::profile::symbols::Frame;

/// One known retainer.
struct Retainer {
    /// What it is.
    name: &'static str,
    /// A frame is its own if the frame's function or library contains one
    /// of these (ASCII, any case).
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
        marks: &["libmkl", "mkl_serv", "mkl_blas", "mm_internal_malloc"],
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

/// The entry functions of threads (glibc's, OpenMP's pools'): where a
/// thread began, never who allocated. Skipped when a stack is matched.
const THREAD_ENTRIES: &[&str] = &[
    "start_thread",
    "clone",
    "gomp_thread_start",
    "__kmp_launch_worker",
    "__kmp_launch_thread",
];

/// The retainer that owns a stack (innermost frames first): the first frame,
/// from the allocation outwards, that a retainer owns; `None` if none does.
fn owner(frames: &[Frame]) -> Option<&'static Retainer> {
    frames
        .iter()
        .filter(|f| !THREAD_ENTRIES.iter().any(|e| f.function == *e))
        .find_map(|f| {
            KNOWN.iter().find(|r| {
                r.marks
                    .iter()
                    .any(|m| contains_ci(&f.function, m) || contains_ci(&f.library, m))
            })
        })
}

/// A line for each known retainer that holds live bytes in `p`, each byte
/// counted for one retainer only.
pub fn found(p: &Profile) -> Vec<String> {
    let mut held = vec![0i64; KNOWN.len()];
    for s in &p.stacks {
        if let Some(r) = owner(&s.frames) {
            let i = KNOWN.iter().position(|k| std::ptr::eq(k, r)).unwrap_or(0);
            held[i] += s.bytes;
        }
    }
    KNOWN
        .iter()
        .zip(held)
        .filter(|&(_, b)| b > 0)
        .map(|(r, b)| format!("{}: {} live here. {}.", r.name, signed_bytes(b), r.advice))
        .collect()
}

fn contains_ci(hay: &str, needle: &str) -> bool {
    hay.to_ascii_lowercase()
        .contains(&needle.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::heap::{Stack, test_profile};

    #[test]
    fn a_retainer_is_named_only_when_it_holds_memory() {
        let frame = |f: &str, l: &str| Frame::new(f, l);
        let p = Profile {
            maps: vec![],
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

    /// The double count of issue 47: 8 MiB that MKL allocated on a thread
    /// of OpenMP's pool is MKL's, named once; what the pool allocates
    /// itself is the pool's.
    #[test]
    fn a_byte_is_named_by_the_retainer_closest_to_its_allocation_only() {
        const GOMP: &str = "libgomp-a34b3233.so.1";
        let p = test_profile(&[
            (
                8 << 20,
                &[
                    ("mm_internal_malloc", "libtorch_cpu.so"),
                    ("sgemm_oncopy", "libtorch_cpu.so"),
                    ("at::parallel_for", "libtorch_cpu.so"),
                    ("gomp_thread_start", GOMP),
                    ("start_thread", "libc.so.6"),
                    ("clone", "libc.so.6"),
                ],
            ),
            (
                1 << 20,
                &[
                    ("gomp_malloc", GOMP),
                    ("gomp_team_start", GOMP),
                    ("main", "app"),
                ],
            ),
            // PyTorch's own buffer on a pool thread: nobody's.
            (
                4 << 20,
                &[
                    ("c10::alloc_cpu", "libc10.so"),
                    ("at::parallel_for", "libtorch_cpu.so"),
                    ("gomp_thread_start", GOMP),
                    ("start_thread", "libc.so.6"),
                    ("clone", "libc.so.6"),
                ],
            ),
        ]);
        let lines = found(&p);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[0].starts_with("Intel MKL's buffers: 8.0 MiB"),
            "{lines:?}"
        );
        assert!(
            lines[1].starts_with("OpenMP thread pools (libgomp, libiomp): 1.0 MiB"),
            "{lines:?}"
        );
    }
}
