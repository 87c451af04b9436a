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
//! Allocation-free and lock-free: one `sysinfo` system call for mappings of
//! 1 GiB or more, and a read of `/proc/sys/vm/overcommit_memory` (one
//! transient descriptor, close-on-exec) only for those above the limit.
//! Policy 1 (always) and 2 (strict: jemalloc maps without `MAP_NORESERVE`,
//! and the kernel does its own accounting) are left alone, as is a policy
//! that cannot be read.

/// Smaller mappings are never checked: no machine has less RAM than this.
const CHECK_FROM: usize = 1 << 30;

/// Whether the kernel, under the heuristic policy, would refuse an
/// accounted anonymous mapping of `len` bytes.
pub fn refuses(len: usize) -> bool {
    if len < CHECK_FROM {
        return false;
    }
    let Some(limit) = ram_and_swap() else {
        return false;
    };
    len as u128 > limit && policy() == Some(b'0')
}

/// Total RAM plus total swap, in bytes (`sysinfo`).
fn ram_and_swap() -> Option<u128> {
    // SAFETY: sysinfo writes one `struct sysinfo`, all of it plain data, so
    // all-zero bytes are a valid value to start from.
    let mut si: libc::sysinfo = unsafe { core::mem::zeroed() };
    // SAFETY: `si` is a valid, writable `struct sysinfo`.
    if unsafe { libc::syscall(libc::SYS_sysinfo, &mut si as *mut libc::sysinfo) } != 0 {
        return None;
    }
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
        assert!(!refuses(4096) && !refuses(CHECK_FROM - 1));
        let limit = ram_and_swap().expect("sysinfo");
        assert!(limit >= CHECK_FROM as u128);
        assert!(!refuses(CHECK_FROM));
        let beyond = usize::try_from(limit * 2).unwrap_or(usize::MAX);
        assert_eq!(refuses(beyond), policy() == Some(b'0'));
    }
}
