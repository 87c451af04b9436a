//! The kernel's overcommit heuristic, for jemalloc's mappings.
//!
//! Under `vm.overcommit_memory=0` (the default) the kernel refuses one
//! mapping larger than all of RAM and swap (`__vm_enough_memory`, mm/util.c:
//! `pages > totalram_pages() + total_swap_pages`), unless it is
//! `MAP_NORESERVE`. glibc's `malloc(256 GiB)` on a 24 GiB machine therefore
//! returns NULL with ENOMEM, and Python raises `MemoryError`. jemalloc maps
//! with `MAP_NORESERVE` whenever the policy is 0 or 1 (`pages_boot`), so the
//! same request succeeded under the shim, and the program learnt that the
//! memory was not there only from the OOM killer when it touched it.
//!
//! The shim's `mmap` wrapper (exports.rs; jemalloc's calls reach it through
//! `--wrap=mmap`) asks [`refuses`] first and fails such a mapping as the
//! kernel would have. jemalloc then falls back to a mapping of exactly the
//! requested size (`ecache_alloc_grow`: its geometric growth of retained
//! memory may ask for more than the request), so a request the kernel
//! would grant is never refused.
//!
//! This is the heuristic of current kernels (checked on this machine's 6.x);
//! older ones estimated free memory instead and could also refuse requests
//! below RAM and swap, which the shim does not imitate.
//!
//! Allocation-free, lock-free and made of raw system calls (os/raw.rs says
//! why): one `sysinfo` for private, non-fixed mappings of 1 GiB or more,
//! and a read of `/proc/sys/vm/overcommit_memory` (one transient
//! descriptor, close-on-exec) only for those above the limit. Policy 1
//! (always) and 2 (strict: jemalloc maps without `MAP_NORESERVE`, and the
//! kernel does its own accounting) are left alone, as is a policy or a
//! total that cannot be read.

/// Smaller mappings are not checked (a cost for every mapping jemalloc
/// makes); only a machine with less than this in RAM and swap would have
/// refused one.
const CHECK_FROM: usize = 1 << 30;

/// Whether the kernel, under the heuristic policy, would refuse the
/// mapping (`len` bytes, `mmap` `flags`) if it were accounted: a private,
/// not fixed, `MAP_NORESERVE` one larger than RAM and swap.
pub fn refuses(len: usize, flags: i32) -> bool {
    let accounted = libc::MAP_NORESERVE | libc::MAP_PRIVATE;
    if len < CHECK_FROM || flags & accounted != accounted || flags & libc::MAP_FIXED != 0 {
        return false;
    }
    let Some(limit) = ram_and_swap() else {
        return false;
    };
    len as u128 > limit && policy() == Some(b'0')
}

/// Total RAM plus total swap, in bytes (`sysinfo`).
fn ram_and_swap() -> Option<u128> {
    let si = super::raw::sysinfo()?;
    let unit = u128::from(si.mem_unit.max(1));
    Some((u128::from(si.totalram) + u128::from(si.totalswap)) * unit)
}

/// The first byte of `/proc/sys/vm/overcommit_memory`.
fn policy() -> Option<u8> {
    let mut buf = [0u8; 4];
    let n = super::raw::read_file(c"/proc/sys/vm/overcommit_memory", &mut buf)?;
    (n > 0).then_some(buf[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_mappings_beyond_ram_and_swap_are_refused_and_only_under_policy_0() {
        let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        assert!(!refuses(4096, anon) && !refuses(CHECK_FROM - 1, anon));
        let limit = ram_and_swap().expect("sysinfo");
        if limit >= CHECK_FROM as u128 {
            assert!(!refuses(CHECK_FROM, anon));
        }
        let beyond = usize::try_from(limit * 2).unwrap_or(usize::MAX);
        assert_eq!(refuses(beyond, anon), policy() == Some(b'0'));
        // Not what the heuristic would have looked at: left to the kernel.
        assert!(!refuses(beyond, anon & !libc::MAP_NORESERVE));
        assert!(!refuses(beyond, anon | libc::MAP_FIXED));
        assert!(!refuses(
            beyond,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE
        ));
    }
}
