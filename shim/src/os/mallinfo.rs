//! glibc's `struct mallinfo` and `struct mallinfo2`: what the preload's
//! `mallinfo`/`mallinfo2` return (glibc_api.rs) and what the attached
//! bridge reads from glibc's own (bridge/heap.rs).

use core::ffi::c_int;

/// glibc's `struct mallinfo` (int fields, deprecated but still used).
#[repr(C)]
#[derive(Default)]
pub struct Mallinfo {
    /// Bytes the heap(s) took with `sbrk`/`mmap` for small chunks.
    pub arena: c_int,
    /// Free chunks.
    pub ordblks: c_int,
    /// Free fastbin chunks.
    pub smblks: c_int,
    /// Chunks allocated with `mmap`.
    pub hblks: c_int,
    /// Bytes in chunks allocated with `mmap`.
    pub hblkhd: c_int,
    /// 0 (unused since glibc 2.3).
    pub usmblks: c_int,
    /// Bytes in free fastbin chunks.
    pub fsmblks: c_int,
    /// Bytes in allocated chunks.
    pub uordblks: c_int,
    /// Bytes in free chunks.
    pub fordblks: c_int,
    /// Bytes at the top of the heap that `malloc_trim` can release.
    pub keepcost: c_int,
}

/// glibc's `struct mallinfo2` (size_t fields, glibc 2.33).
#[repr(C)]
#[derive(Default)]
pub struct Mallinfo2 {
    /// Bytes the heap(s) took with `sbrk`/`mmap` for small chunks.
    pub arena: usize,
    /// Free chunks.
    pub ordblks: usize,
    /// Free fastbin chunks.
    pub smblks: usize,
    /// Chunks allocated with `mmap`.
    pub hblks: usize,
    /// Bytes in chunks allocated with `mmap`.
    pub hblkhd: usize,
    /// 0 (unused since glibc 2.3).
    pub usmblks: usize,
    /// Bytes in free fastbin chunks.
    pub fsmblks: usize,
    /// Bytes in allocated chunks.
    pub uordblks: usize,
    /// Bytes in free chunks.
    pub fordblks: usize,
    /// Bytes at the top of the heap that `malloc_trim` can release.
    pub keepcost: usize,
}
