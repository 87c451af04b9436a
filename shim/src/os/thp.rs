//! Transparent huge pages, as far as giving memory back is concerned.
//!
//! jemalloc gives a free range back with `madvise(MADV_DONTNEED)`. Where
//! the range covers only part of a huge page (a 2 MiB folio, or a smaller
//! one of the kernel's multi-size THP), the kernel unmaps that part, so the
//! process's RSS drops, but the folio stays whole, and **charged to the
//! memory cgroup**, until reclaim splits it ("deferred split"). The
//! cgroup's usage, which dashboards and the OOM killer read, does not move;
//! under a limit the OOM killer can come before reclaim has split enough
//! (docs/design.md, "RSS is not the charge"). `MADV_FREE` on such a part
//! splits the folio at once (since Linux 4.5); the `MADV_DONTNEED` that
//! follows then frees its pages, and the cgroup's usage drops with RSS.
//!
//! So where huge pages may back the heap ([`refresh`]), the `madvise`
//! wrapper (exports.rs) gives `MADV_FREE` to the head and the tail of each
//! `MADV_DONTNEED` range that are not whole huge pages ([`split_edges`]),
//! at most two more system calls per purged range. Elsewhere it adds
//! nothing: on small pages the extra call costs about half as much again
//! as the purge and returns nothing more. The shim's thread decides, at its
//! start and then every [`LOOK_MS`]; until it has, nothing is split.

use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// How often the shim's thread looks at the THP settings again.
pub const LOOK_MS: u64 = 30_000;

/// The largest huge page size that may back the heap, in bytes (a power of
/// two), or 0 for none (or not known yet).
static SPLIT: AtomicUsize = AtomicUsize::new(0);

/// Before `MADV_DONTNEED` of `len` bytes at `addr`: calls `free(start,
/// len)` for the parts of the range that lie in a huge page the range does
/// not cover whole (one before its first huge page boundary, one after its
/// last). Lock-free and allocation-free: the `madvise` wrapper runs inside
/// `free`.
#[inline]
pub fn split_edges(addr: usize, len: usize, mut free: impl FnMut(usize, usize)) {
    let h = SPLIT.load(Relaxed);
    if h == 0 || len == 0 {
        return;
    }
    let end = addr.saturating_add(len);
    let head_end = addr.checked_next_multiple_of(h).unwrap_or(end).min(end);
    let tail_start = (end & !(h - 1)).max(head_end);
    if addr < head_end {
        free(addr, head_end - addr);
    }
    if tail_start < end {
        free(tail_start, end - tail_start);
    }
}

/// The kernel's THP mode for a size: the word in brackets of an `enabled`
/// file ("always [madvise] never").
fn mode(file: &[u8]) -> Option<&[u8]> {
    let open = file.iter().position(|&b| b == b'[')?;
    let len = file[open + 1..].iter().position(|&b| b == b']')?;
    Some(&file[open + 1..open + 1 + len])
}

/// The largest huge page size that may back jemalloc's mappings, from the
/// kernel's modes (`enabled` of the PMD size and, where the kernel has
/// them, of each multi-size THP `hugepages-<N>kB`, `inherit` meaning the
/// PMD size's), jemalloc's `opt.thp` (`always` makes `madvise` mode count,
/// `never` turns huge pages off for its mappings) and the process's
/// `PR_SET_THP_DISABLE`. `read(path, buf)` reads a sysfs file.
fn in_effect(
    je_thp: &[u8],
    thp_disabled: bool,
    page: usize,
    mut read: impl FnMut(&str, &mut [u8]) -> Option<usize>,
) -> usize {
    if thp_disabled || je_thp == b"never" {
        return 0;
    }
    const DIR: &str = "/sys/kernel/mm/transparent_hugepage";
    let mut buf = [0u8; 128];
    let Some(n) = read(&format!("{DIR}/enabled"), &mut buf) else {
        return 0; // no THP in this kernel
    };
    let top = mode(&buf[..n]).map(<[u8]>::to_vec).unwrap_or_default();
    let backs = |m: &[u8]| m == b"always" || (m == b"madvise" && je_thp == b"always");
    let pmd = read(&format!("{DIR}/hpage_pmd_size"), &mut buf)
        .and_then(|n| core::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok())
        .filter(|s: &usize| s.is_power_of_two() && *s > page)
        .unwrap_or(2 << 20);
    let mut size = pmd;
    while size > page {
        let own = read(
            &format!("{DIR}/hugepages-{}kB/enabled", size >> 10),
            &mut buf,
        )
        .and_then(|n| mode(&buf[..n]).map(<[u8]>::to_vec));
        let m = match own.as_deref() {
            Some(b"inherit") => top.as_slice(),
            Some(m) => m,
            None if size == pmd => top.as_slice(), // a kernel before multi-size THP
            None => b"never",
        };
        if backs(m) {
            return size;
        }
        size >>= 1;
    }
    0
}

/// Looks at the settings again, given jemalloc's `opt.thp` (`je_thp`, as
/// `default` where jemalloc has none) and its page size: the caller reads
/// them from jemalloc, so that `os/` stays below it. Shim's thread (it
/// opens files).
pub fn refresh(je_thp: &[u8], page: usize) {
    let disabled = super::raw::thp_disabled();
    let size = in_effect(je_thp, disabled, page, |path, buf| {
        let c = std::ffi::CString::new(path).ok()?;
        super::proc::read_file(&c, buf)
    });
    SPLIT.store(size, Relaxed);
}

/// What [`refresh`] found: the huge page size the `madvise` wrapper splits
/// at, 0 for none. For `stats`.
pub fn split_size() -> usize {
    SPLIT.load(Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edges(h: usize, addr: usize, len: usize) -> Vec<(usize, usize)> {
        SPLIT.store(h, Relaxed);
        let mut v = vec![];
        split_edges(addr, len, |a, l| v.push((a, l)));
        SPLIT.store(0, Relaxed);
        v
    }

    #[test]
    fn only_the_parts_of_huge_pages_a_range_does_not_cover_are_split() {
        const H: usize = 2 << 20;
        const K: usize = 1 << 10;
        let b = 64 * H; // a huge page boundary
        // Off: nothing.
        assert_eq!(edges(0, b + 4 * K, 64 * K), []);
        // Inside one huge page: the whole range.
        assert_eq!(edges(H, b + 4 * K, 64 * K), [(b + 4 * K, 64 * K)]);
        // Whole huge pages: nothing.
        assert_eq!(edges(H, b, 3 * H), []);
        // Over boundaries: the head up to the first, the tail after the last.
        assert_eq!(
            edges(H, b + H - 8 * K, 8 * K + 2 * H + 12 * K),
            [(b + H - 8 * K, 8 * K), (b + 3 * H, 12 * K)]
        );
        // Starting on a boundary, ending inside: the tail only.
        assert_eq!(edges(H, b, H + 4 * K), [(b + H, 4 * K)]);
        // Ending on a boundary: the head only.
        assert_eq!(edges(H, b - 4 * K, 4 * K + H), [(b - 4 * K, 4 * K)]);
        // Empty.
        assert_eq!(edges(H, b + 4 * K, 0), []);
    }

    fn files(list: &[(&str, &str)]) -> impl FnMut(&str, &mut [u8]) -> Option<usize> + use<> {
        let list: Vec<(String, String)> = list
            .iter()
            .map(|(p, c)| {
                (
                    format!("/sys/kernel/mm/transparent_hugepage/{p}"),
                    c.to_string(),
                )
            })
            .collect();
        move |path, buf| {
            let (_, c) = list.iter().find(|(p, _)| p == path)?;
            buf[..c.len()].copy_from_slice(c.as_bytes());
            Some(c.len())
        }
    }

    #[test]
    fn the_size_that_may_back_the_heap_follows_the_kernel_jemalloc_and_the_process() {
        const P: usize = 4096;
        let old = |m: &str| files(&[("enabled", m), ("hpage_pmd_size", "2097152\n")]);
        let always = "[always] madvise never\n";
        let madvise = "always [madvise] never\n";
        let never = "always madvise [never]\n";
        // A kernel without multi-size THP.
        assert_eq!(in_effect(b"default", false, P, old(always)), 2 << 20);
        assert_eq!(in_effect(b"default", false, P, old(madvise)), 0);
        assert_eq!(in_effect(b"always", false, P, old(madvise)), 2 << 20);
        assert_eq!(in_effect(b"always", false, P, old(never)), 0);
        assert_eq!(in_effect(b"never", false, P, old(always)), 0);
        assert_eq!(in_effect(b"default", true, P, old(always)), 0);
        // No THP at all.
        assert_eq!(in_effect(b"default", false, P, files(&[])), 0);
        // Multi-size THP: the PMD size's own mode, `inherit` of the top one.
        let m = |top: &'static str, pmd: &'static str, k64: &'static str| {
            files(&[
                ("enabled", top),
                ("hpage_pmd_size", "2097152\n"),
                ("hugepages-2048kB/enabled", pmd),
                ("hugepages-64kB/enabled", k64),
                ("hugepages-16kB/enabled", "always inherit madvise [never]\n"),
            ])
        };
        let inherit = "always [inherit] madvise never\n";
        let never4 = "always inherit madvise [never]\n";
        let always4 = "[always] inherit madvise never\n";
        assert_eq!(
            in_effect(b"default", false, P, m(always, inherit, never4)),
            2 << 20
        );
        assert_eq!(
            in_effect(b"default", false, P, m(always, never4, never4)),
            0
        );
        assert_eq!(
            in_effect(b"default", false, P, m(never, never4, always4)),
            64 << 10
        );
        assert_eq!(
            in_effect(b"default", false, P, m(madvise, inherit, inherit)),
            0
        );
        assert_eq!(
            in_effect(b"always", false, P, m(madvise, inherit, never4)),
            2 << 20
        );
    }
}
