//! Every entry point from C: the exported symbols, one line each, a comment
//! beside every special case (mimalloc's `alloc-override.c` is the model),
//! jemalloc's configuration hook, and the constructor and destructor.
//!
//! The allocation functions forward to jemalloc (linked statically with the
//! `_rjem_` prefix, so none of jemalloc's own symbols are exported), or to
//! `alloc.rs` where glibc answers differently. Their rules: no locks, no
//! allocation, no formatting, no Rust thread-locals, no panicking paths;
//! the only libc call is `__errno_location`. `free` keeps errno through
//! the wrappers of jemalloc's system calls (below). Symbols stay unversioned:
//! ld.so binds versioned references such as `malloc@GLIBC_2.2.5` to an
//! unversioned definition found earlier in the search order (the preload).
//!
//! Unit tests build without the `#[no_mangle]`s, which would replace the
//! test binary's own malloc.

use crate::{alloc, glibc_api, options, os, thread};
use core::ffi::{c_char, c_int, c_void};
use tikv_jemalloc_sys as je;

macro_rules! export {
    ($(#[$m:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        ///
        /// # Safety
        /// The C contract of the function of the same name in glibc.
        #[cfg_attr(not(test), unsafe(no_mangle))]
        #[inline(never)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) $(-> $ret)? {
            // SAFETY: the caller upholds the C contract; each body forwards
            // to a function with the same contract.
            #[allow(unused_unsafe)]
            unsafe { $body }
        }
    };
}

// --- What glibc's manual says a replacement malloc must provide ------------
export!(
    /// `malloc`
    #[unsafe(link_section = ".text.startup")]
    fn malloc(size: usize) -> *mut c_void {
        alloc::malloc(size)
    }
);
export!(
    /// `free`; errno is kept by the wrappers of jemalloc's system calls.
    #[unsafe(link_section = ".text.startup")]
    fn free(p: *mut c_void) {
        alloc::free(p)
    }
);
export!(
    /// `calloc`; jemalloc checks `n * size` for overflow and sets ENOMEM.
    #[unsafe(link_section = ".text.startup")]
    fn calloc(n: usize, size: usize) -> *mut c_void {
        alloc::calloc(n, size)
    }
);
export!(
    /// `realloc`; `realloc(p, 0)` frees like glibc.
    #[unsafe(link_section = ".text.startup")]
    fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
        alloc::realloc(p, size)
    }
);

// --- What it says a general-purpose replacement should provide --------------
export!(
    /// `reallocarray` (glibc 2.26): overflow is ENOMEM, as in glibc.
    fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
        alloc::reallocarray(p, n, size)
    }
);
export!(
    /// `aligned_alloc`: strict (C17) where the host glibc is >= 2.38, like `memalign` before.
    fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
        alloc::aligned_alloc(align, size)
    }
);
export!(
    /// `posix_memalign`: jemalloc applies POSIX's checks (EINVAL, ENOMEM).
    fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
        alloc::posix_memalign(out, align, size)
    }
);
export!(
    /// `memalign`: any alignment, rounded up to a power of two like glibc.
    fn memalign(align: usize, size: usize) -> *mut c_void {
        alloc::memalign(align, size)
    }
);
export!(
    /// `valloc`: page-aligned.
    fn valloc(size: usize) -> *mut c_void {
        alloc::memalign(alloc::page(), size)
    }
);
export!(
    /// `pvalloc`: page-aligned, size rounded up to whole pages (overflow is ENOMEM).
    fn pvalloc(size: usize) -> *mut c_void {
        alloc::pvalloc(size)
    }
);
export!(
    /// `malloc_usable_size`: 0 for NULL, like glibc.
    fn malloc_usable_size(p: *mut c_void) -> usize {
        alloc::usable_size(p)
    }
);
export!(
    /// `free_sized` (C23, glibc 2.43). The size is ignored, as glibc does: jemalloc's
    /// sized free trusts it, and a wrong size from a buggy caller would corrupt
    /// the heap instead of being harmless.
    fn free_sized(p: *mut c_void, _size: usize) {
        alloc::free(p)
    }
);
export!(
    /// `free_aligned_sized` (C23): see `free_sized`.
    fn free_aligned_sized(p: *mut c_void, _align: usize, _size: usize) {
        alloc::free(p)
    }
);
export!(
    /// `cfree`: obsolete alias of `free`, still called by very old programs.
    fn cfree(p: *mut c_void) {
        alloc::free(p)
    }
);

// --- glibc's internal names, which other interposers and debug tools call as
//     "the real malloc" --------------------------------------------------------
export!(
    /// `__libc_malloc`
    fn __libc_malloc(size: usize) -> *mut c_void {
        alloc::malloc(size)
    }
);
export!(
    /// `__libc_free`
    fn __libc_free(p: *mut c_void) {
        alloc::free(p)
    }
);
export!(
    /// `__libc_calloc`
    fn __libc_calloc(n: usize, size: usize) -> *mut c_void {
        alloc::calloc(n, size)
    }
);
export!(
    /// `__libc_realloc`
    fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void {
        alloc::realloc(p, size)
    }
);
export!(
    /// `__libc_memalign` (ld.so used it before glibc 2.25)
    fn __libc_memalign(align: usize, size: usize) -> *mut c_void {
        alloc::memalign(align, size)
    }
);
export!(
    /// `__libc_valloc`
    fn __libc_valloc(size: usize) -> *mut c_void {
        alloc::memalign(alloc::page(), size)
    }
);
export!(
    /// `__libc_pvalloc`
    fn __libc_pvalloc(size: usize) -> *mut c_void {
        alloc::pvalloc(size)
    }
);
export!(
    /// `__posix_memalign`
    fn __posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
        alloc::posix_memalign(out, align, size)
    }
);

// --- jemalloc's own API, for programs linked to a jemalloc library -----------
//     (Debian's libjemalloc.so.2: redis, varnish). Under the preload the
//     malloc family above comes from here and these would come from that
//     library, whose heap is another: `dallocx(malloc(n))` crashed. They
//     are the shim's jemalloc's, so the process has one heap. A program that
//     links jemalloc statically keeps its own (its definitions come first).
export!(
    /// `mallocx`
    fn mallocx(size: usize, flags: c_int) -> *mut c_void {
        je::mallocx(size, flags)
    }
);
export!(
    /// `rallocx`
    fn rallocx(p: *mut c_void, size: usize, flags: c_int) -> *mut c_void {
        je::rallocx(p, size, flags)
    }
);
export!(
    /// `xallocx`
    fn xallocx(p: *mut c_void, size: usize, extra: usize, flags: c_int) -> usize {
        je::xallocx(p, size, extra, flags)
    }
);
export!(
    /// `sallocx`
    fn sallocx(p: *const c_void, flags: c_int) -> usize {
        je::sallocx(p, flags)
    }
);
export!(
    /// `dallocx`
    fn dallocx(p: *mut c_void, flags: c_int) {
        je::dallocx(p, flags)
    }
);
export!(
    /// `sdallocx`
    fn sdallocx(p: *mut c_void, size: usize, flags: c_int) {
        je::sdallocx(p, size, flags)
    }
);
export!(
    /// `nallocx`
    fn nallocx(size: usize, flags: c_int) -> usize {
        je::nallocx(size, flags)
    }
);
export!(
    /// `mallctl`: the shim's jemalloc (the same names and figures as that
    /// library's, jemalloc 5.3).
    fn mallctl(
        name: *const c_char,
        oldp: *mut c_void,
        oldlenp: *mut usize,
        newp: *mut c_void,
        newlen: usize,
    ) -> c_int {
        je::mallctl(name, oldp, oldlenp, newp, newlen)
    }
);
export!(
    /// `mallctlnametomib`
    fn mallctlnametomib(name: *const c_char, mibp: *mut usize, miblenp: *mut usize) -> c_int {
        je::mallctlnametomib(name, mibp, miblenp)
    }
);
export!(
    /// `mallctlbymib`
    fn mallctlbymib(
        mib: *const usize,
        miblen: usize,
        oldp: *mut c_void,
        oldlenp: *mut usize,
        newp: *mut c_void,
        newlen: usize,
    ) -> c_int {
        je::mallctlbymib(mib, miblen, oldp, oldlenp, newp, newlen)
    }
);
export!(
    /// `malloc_stats_print`
    fn malloc_stats_print(
        write_cb: Option<unsafe extern "C" fn(*mut c_void, *const c_char)>,
        cbopaque: *mut c_void,
        opts: *const c_char,
    ) {
        je::malloc_stats_print(write_cb, cbopaque, opts)
    }
);

// --- glibc's malloc control API (glibc_api.rs) ---------------------------------
export!(
    /// `malloc_trim`: purges every arena; 1 if memory went back to the OS.
    fn malloc_trim(_pad: usize) -> c_int {
        glibc_api::malloc_trim()
    }
);
export!(
    /// `mallinfo2` filled from jemalloc's statistics.
    fn mallinfo2() -> glibc_api::Mallinfo2 {
        glibc_api::mallinfo2()
    }
);
export!(
    /// `mallinfo`: as `mallinfo2`, saturated to `int` like glibc's.
    fn mallinfo() -> glibc_api::Mallinfo {
        glibc_api::mallinfo()
    }
);
export!(
    /// `mallopt`: glibc's tunables have no jemalloc meaning (use
    /// `MEMSHIM_*`); the answer is glibc's own (`glibc_api::mallopt`).
    fn mallopt(param: c_int, value: c_int) -> c_int {
        glibc_api::mallopt(param, value)
    }
);
export!(
    /// `malloc_stats`: a summary on stderr in glibc's layout.
    fn malloc_stats() {
        glibc_api::malloc_stats()
    }
);
export!(
    /// `malloc_info(options, fp)`: XML in glibc's shape; `options` must be 0
    /// (glibc returns EINVAL otherwise). `fp` must be open for writing. 0
    /// whether the stream took the text or not, as glibc answers (an error
    /// stays on the stream, for `ferror`).
    fn malloc_info(options: c_int, fp: *mut libc::FILE) -> c_int {
        if options != 0 || fp.is_null() {
            return libc::EINVAL;
        }
        let xml = glibc_api::malloc_info_xml();
        libc::fwrite(xml.as_ptr().cast::<c_void>(), 1, xml.len(), fp);
        0
    }
);

// --- Threads and namespaces (thread/) -----------------------------------------
export!(
    /// `pthread_create`: creates the application's thread exactly as glibc
    /// does; then, if it is the process's second, the shim's thread starts.
    fn pthread_create(
        t: *mut libc::pthread_t,
        attr: *const libc::pthread_attr_t,
        start: extern "C" fn(*mut c_void) -> *mut c_void,
        arg: *mut c_void,
    ) -> c_int {
        let Some(real) = os::thread::real_pthread_create() else {
            return libc::EAGAIN;
        };
        // Before a second thread exists (jemalloc.rs, "Lazy initialisation").
        crate::jemalloc::ensure_init();
        thread::before_app_thread_create();
        let mut rc = real(t, attr, start, arg);
        if rc == libc::EAGAIN {
            // At a limit of threads, where the shim's may hold the slot.
            rc = thread::retry_with_room(|| real(t, attr, start, arg));
        }
        if rc == 0 {
            thread::after_app_thread_created();
        }
        rc
    }
);
export!(
    /// `pthread_exit`: when the main thread ends with it while other threads
    /// run on, the shim's threads stop first and for good, so that the
    /// application's last thread is the process's last, the one glibc runs
    /// `exit(0)` on (thread/mod.rs, `before_pthread_exit`).
    fn pthread_exit(retval: *mut c_void) -> ! {
        thread::before_pthread_exit();
        match os::thread::real_pthread_exit() {
            Some(real) => real(retval),
            // Not reached: glibc defines it. End this thread as the kernel would.
            None => loop {
                libc::syscall(libc::SYS_exit, 0);
            },
        }
    }
);
export!(
    /// `unshare`: `CLONE_NEWUSER` (and `CLONE_VM`/`CLONE_SIGHAND`/`CLONE_THREAD`)
    /// need a single-threaded caller; a process alone but for the shim's
    /// thread gets it stopped first, as for `fork`.
    fn unshare(flags: c_int) -> c_int {
        thread::before_unshare(flags);
        libc::syscall(libc::SYS_unshare, flags as libc::c_long) as c_int
    }
);
export!(
    /// `setns`: entering a user, mount or time namespace needs a
    /// single-threaded caller (a mount namespace: one whose filesystem
    /// context no other thread shares); as `unshare`.
    fn setns(fd: c_int, nstype: c_int) -> c_int {
        thread::before_setns(nstype);
        libc::syscall(libc::SYS_setns, fd as libc::c_long, nstype as libc::c_long) as c_int
    }
);

/// The set*id functions: glibc's, with the shim's threads stopped around
/// the call (thread/mod.rs, `around_setxid`, says why). glibc's own is
/// found once, with `dlsym(RTLD_NEXT)`.
macro_rules! setxid {
    ($(#[$m:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?)) => {
        export!(
            $(#[$m])*
            fn $name($($arg: $ty),*) -> c_int {
                static REAL: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);
                let name = concat!(stringify!($name), "\0").as_bytes();
                // Looked up at the first call, not at every exec: `dlsym` takes
                // the loader's lock (a fork child gets it reset by glibc).
                let p = {
                    let _e = os::KeepErrno::new();
                    os::dl::next_once(&REAL, core::ffi::CStr::from_bytes_with_nul_unchecked(name))
                };
                if p == 0 {
                    // Not reached: glibc defines it.
                    *libc::__errno_location() = libc::ENOSYS;
                    return -1;
                }
                // SAFETY: glibc's function of this name has this type.
                let real = core::mem::transmute::<usize, unsafe extern "C" fn($($ty),*) -> c_int>(p);
                thread::around_setxid(|| real($($arg),*))
            }
        );
    };
}
setxid!(
    /// `setuid`
    fn setuid(uid: libc::uid_t)
);
setxid!(
    /// `setgid`
    fn setgid(gid: libc::gid_t)
);
setxid!(
    /// `seteuid`
    fn seteuid(uid: libc::uid_t)
);
setxid!(
    /// `setegid`
    fn setegid(gid: libc::gid_t)
);
setxid!(
    /// `setreuid`
    fn setreuid(ruid: libc::uid_t, euid: libc::uid_t)
);
setxid!(
    /// `setregid`
    fn setregid(rgid: libc::gid_t, egid: libc::gid_t)
);
setxid!(
    /// `setresuid`
    fn setresuid(ruid: libc::uid_t, euid: libc::uid_t, suid: libc::uid_t)
);
setxid!(
    /// `setresgid`
    fn setresgid(rgid: libc::gid_t, egid: libc::gid_t, sgid: libc::gid_t)
);
setxid!(
    /// `setgroups`
    fn setgroups(n: libc::size_t, groups: *const libc::gid_t)
);
setxid!(
    /// `initgroups`: calls glibc's `setgroups` inside glibc, past ours.
    fn initgroups(user: *const c_char, group: libc::gid_t)
);

/// `dlopen`: clears `RTLD_DEEPBIND` (if enabled, and counts it) and
/// tail-jumps to glibc's, so glibc still sees the original caller
/// (deepbind.rs says why both matter). While the shim's thread may need a
/// spawner it lacks, it first tells the thread layer which library is
/// being loaded (os/spawner.rs).
///
/// # Safety
/// The C contract of `dlopen`.
#[cfg(target_arch = "x86_64")]
#[cfg_attr(not(test), unsafe(no_mangle))]
#[unsafe(naked)]
pub unsafe extern "C" fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void {
    core::arch::naked_asm!(
        // if WATCH: before_dlopen(file), keeping the argument registers
        "cmp byte ptr [rip + {watch}], 0",
        "je 1f",
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {before}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "1:",
        // if (mode & RTLD_DEEPBIND) && CLEAR: clear the flag and count it
        "test esi, 8",
        "jz 2f",
        "cmp byte ptr [rip + {clear}], 0",
        "je 2f",
        "and esi, -9",
        "lock inc qword ptr [rip + {count}]",
        "2:",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 3f",
        "jmp rax",
        // Not resolved yet: resolve, keeping the argument registers.
        "3:",
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {resolve}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 4f",
        "jmp rax",
        "4:",
        "xor eax, eax",
        "ret",
        clear = sym crate::deepbind::CLEAR,
        count = sym crate::deepbind::CLEARED,
        real = sym crate::deepbind::REAL,
        resolve = sym crate::deepbind::resolve_real,
        watch = sym crate::os::spawner::WATCH,
        before = sym before_dlopen,
    )
}

/// Defines the hidden symbol `$sym` as a jump to `$target`: what a
/// `--wrap=NAME` link flag (`build.rs`) binds the calls to `NAME` to, without
/// exporting a symbol.
macro_rules! wrap_target {
    ($sym:literal, $target:path) => {
        #[cfg(not(test))]
        core::arch::global_asm!(
            // Beside the start-up code ("Start-up pages" below): jemalloc's
            // initialisation and the constructor go through these jumps.
            ".pushsection .text.startup,\"ax\",@progbits",
            concat!(".globl ", $sym),
            concat!(".hidden ", $sym),
            concat!(".type ", $sym, ",@function"),
            concat!($sym, ":"),
            #[cfg(target_arch = "x86_64")]
            "jmp {f}",
            #[cfg(target_arch = "aarch64")]
            "b {f}",
            concat!(".size ", $sym, ", . - ", $sym),
            ".popsection",
            f = sym $target,
        );
    };
}

// --- jemalloc's configuration -------------------------------------------------

#[cfg(not(test))]
unsafe extern "C" {
    /// glibc's `secure_getenv`, as renamed by `--wrap` (see `build.rs`).
    fn __real_secure_getenv(name: *const c_char) -> *mut c_char;
}

/// Unit tests link without `--wrap`.
#[cfg(test)]
unsafe fn __real_secure_getenv(name: *const c_char) -> *mut c_char {
    // SAFETY: forwarding a C string.
    unsafe { libc::getenv(name) }
}

/// Target of `--wrap=secure_getenv` (through the hidden trampoline below,
/// so the library exports no extra symbol): jemalloc asks for
/// `_RJEM_MALLOC_CONF` during its initialisation and gets the composed
/// configuration (options.rs); every other name goes to glibc. The call
/// also marks where errno is taken, to be kept through the
/// initialisation (jemalloc.rs, "errno through jemalloc's initialisation").
///
/// # Safety
/// `name` must be NUL-terminated (what glibc's `secure_getenv` takes).
#[unsafe(link_section = ".text.startup")]
pub unsafe extern "C" fn wrap_secure_getenv(name: *const c_char) -> *mut c_char {
    // SAFETY: the caller passes a C string.
    let key = unsafe { core::ffi::CStr::from_ptr(name) };
    if key.to_bytes() == b"_RJEM_MALLOC_CONF" {
        // Route jemalloc's own complaints through our warning format.
        // SAFETY: jemalloc reads this pointer only when it prints; setting it
        // during its initialisation, before any message, is the documented use.
        unsafe { je::malloc_message = Some(crate::log::jemalloc_message) };
        crate::jemalloc::init_began();
        return options::jemalloc_conf_ptr() as *mut c_char;
    }
    // SAFETY: forwarding the caller's argument unchanged.
    unsafe { __real_secure_getenv(name) }
}

wrap_target!("__wrap_secure_getenv", wrap_secure_getenv);

#[cfg(not(test))]
unsafe extern "C" {
    /// glibc's `readlink`, as renamed by `--wrap` (see `build.rs`).
    fn __real_readlink(path: *const c_char, buf: *mut c_char, len: usize) -> isize;
}

/// Unit tests link without `--wrap`.
#[cfg(test)]
use libc::readlink as __real_readlink;

/// The symbolic link jemalloc's initialisation reads its options from
/// (`/etc/malloc.conf`, named with this build's `_rjem_` prefix).
const JEMALLOC_CONF_LINK: &[u8] = b"/etc/_rjem_malloc.conf";

/// Target of `--wrap=readlink`: jemalloc's initialisation reads
/// [`JEMALLOC_CONF_LINK`] for options, whose warnings would go to fd 2
/// whatever it is then. The shim's configuration is the environment's
/// alone (docs/configuration.md), so that path reads as a link that does
/// not exist: -1, ENOENT (jemalloc then puts errno back itself). Every
/// other path (Rust's `std::fs::read_link`) goes to glibc.
///
/// # Safety
/// The C contract of `readlink`.
#[unsafe(link_section = ".text.startup")]
pub unsafe extern "C" fn wrap_readlink(path: *const c_char, buf: *mut c_char, len: usize) -> isize {
    // SAFETY: `readlink` takes a NUL-terminated path, checked for NULL first.
    let ours = !path.is_null()
        && unsafe { core::ffi::CStr::from_ptr(path) }.to_bytes() == JEMALLOC_CONF_LINK;
    if ours {
        os::set_errno(libc::ENOENT);
        return -1;
    }
    // SAFETY: forwarding the caller's arguments unchanged.
    unsafe { __real_readlink(path, buf, len) }
}

wrap_target!("__wrap_readlink", wrap_readlink);

// --- jemalloc's fork functions run inside the shim's handlers -------------------

use os::thread::AtforkFn;

/// Target of `--wrap=pthread_atfork`: jemalloc's registration, made during
/// its (lazy) initialisation after the shim's fork handlers exist, is kept
/// from glibc, and those handlers call jemalloc's functions in its place
/// (jemalloc.rs, "Lazy initialisation and fork"). Every other registration
/// (the shim's own; jemalloc's before the shim's) goes to glibc
/// (`os::thread::register_atfork`). jemalloc's registration gives errno
/// back what its initialisation found (jemalloc.rs).
///
/// # Safety
/// The C contract of `pthread_atfork`.
#[unsafe(link_section = ".text.startup")]
pub unsafe extern "C" fn wrap_pthread_atfork(
    prepare: AtforkFn,
    parent: AtforkFn,
    child: AtforkFn,
) -> c_int {
    let prepare_at = prepare.map_or(0, |f| f as usize);
    let r = if crate::jemalloc::claim_atfork(prepare_at) {
        0
    } else {
        os::thread::register_atfork(prepare, parent, child)
    };
    crate::jemalloc::init_past_errno(prepare_at);
    r
}

wrap_target!("__wrap_pthread_atfork", wrap_pthread_atfork);

// --- jemalloc's system calls keep errno -----------------------------------------
//
// `free` must leave errno as it found it (glibc guarantees it, POSIX 2024
// requires it). jemalloc's `free` changes errno only when a system call
// inside it fails: a purge's `madvise`, and the `mmap`/`munmap`/`mprotect`
// of its extents and metadata. Those calls are wrapped (`build.rs`) so that
// each keeps errno itself, and `free` forwards to jemalloc with nothing
// around it: saving and restoring errno in every `free` was about 13 of
// the 180 instructions of a small free+malloc pair. jemalloc reads errno
// after none of them except to print `munmap`'s error message, and sets
// ENOMEM itself when an allocation fails. The Rust standard library's calls
// go through the same wrappers (its `mmap` of a signal stack reports a
// failure with a panic, whose message then names no errno).

/// `wrap_$name`, the target of `--wrap=$name` (through the hidden
/// trampoline `$sym`): glibc's `$name`, reached as `$real`, keeping errno.
///
/// With `refuse: COND => VALUE`, the wrapper returns VALUE without calling
/// glibc when COND (over the arguments) holds. With `before: EXPR`, it
/// evaluates EXPR (which may call `$real`) first.
macro_rules! keeps_errno {
    ($name:ident, $real:ident, $wrap:ident, $sym:literal, ($($arg:ident: $ty:ty),*) -> $ret:ty
        $(, refuse: $cond:expr => $refused:expr)? $(, before: $before:expr)?) => {
        #[cfg(not(test))]
        unsafe extern "C" {
            /// glibc's function, as renamed by `--wrap` (see `build.rs`).
            fn $real($($arg: $ty),*) -> $ret;
        }

        /// Unit tests link without `--wrap`.
        #[cfg(test)]
        use libc::$name as $real;

        #[doc = concat!("Target of `--wrap=", stringify!($name), "`: glibc's `", stringify!($name), "`, keeping errno.")]
        ///
        /// # Safety
        /// The C contract of the glibc function.
        pub unsafe extern "C" fn $wrap($($arg: $ty),*) -> $ret {
            let _e = os::KeepErrno::new();
            $(if $cond {
                return $refused;
            })?
            $($before;)?
            // SAFETY: forwarding the caller's arguments unchanged.
            unsafe { $real($($arg),*) }
        }

        wrap_target!($sym, $wrap);
    };
}

// A purge's `MADV_DONTNEED` first splits the huge pages it covers only in
// part, where huge pages may back the heap, so that the memory cgroup gets
// their free pages back at once (os/thp.rs).
keeps_errno!(madvise, __real_madvise, wrap_madvise, "__wrap_madvise",
    (addr: *mut c_void, len: usize, advice: c_int) -> c_int,
    before: split_before_dontneed(addr, len, advice));

/// `MADV_FREE` for the parts of huge pages a `MADV_DONTNEED` of `len` bytes
/// at `addr` covers in part (os/thp.rs). Inside `free`: no lock, no
/// allocation; errno is the wrapper's to keep.
fn split_before_dontneed(addr: *mut c_void, len: usize, advice: c_int) {
    if advice != libc::MADV_DONTNEED {
        return;
    }
    os::thp::split_edges(addr as usize, len, |a, l| {
        // SAFETY: a part of the caller's range, which it is about to
        // discard: MADV_FREE loses nothing that MADV_DONTNEED would keep.
        unsafe { __real_madvise(a as *mut c_void, l, libc::MADV_FREE) };
    });
}

// A `MAP_NORESERVE` mapping the kernel's overcommit heuristic would have
// refused without that flag fails as it would have (os/overcommit.rs), so
// that an impossible `malloc` returns NULL as under glibc.
keeps_errno!(mmap, __real_mmap, wrap_mmap, "__wrap_mmap",
    (addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, off: libc::off_t) -> *mut c_void,
    refuse: os::overcommit::refuses(len, flags) => libc::MAP_FAILED);
// jemalloc falls back to `sbrk` where a mapping failed (the refusal above
// among them); the kernel's ENOMEM there must not reach a `malloc` that the
// next mapping then serves.
keeps_errno!(sbrk, __real_sbrk, wrap_sbrk, "__wrap_sbrk",
    (increment: libc::intptr_t) -> *mut c_void);
keeps_errno!(munmap, __real_munmap, wrap_munmap, "__wrap_munmap",
    (addr: *mut c_void, len: usize) -> c_int);
keeps_errno!(mprotect, __real_mprotect, wrap_mprotect, "__wrap_mprotect",
    (addr: *mut c_void, len: usize, prot: c_int) -> c_int);

// --- Constructor and destructor -------------------------------------------------
//
// Start-up pages. Every exec runs the constructor, and every exit the
// destructor, with what they call; each 64 KiB of the library's code they
// first touch is a page fault (the kernel maps file pages 16 at a time).
// Spread over the library, that code cost seven faults per exec; so each
// function of that path, in this crate and the one it calls in proto, is
// put in `.text.startup`, which the linker places together at the start of
// `.text` (its default script; gcc does the same for `main` and
// constructors), and the path avoids `core::fmt` (`StackBuf::push_i64`).
// A function added to the path without the attribute still works; it costs
// a fault (bench/execcost.py shows it). The fork child handler's path is
// there too, with the `malloc`, `free`, `calloc` and `realloc` above and
// jemalloc's entry points (link.ld): a fork child faults in each 64 KiB of
// code it runs, and a shell allocates between its fork and its exec. The
// statics the path reads and writes lie on one page (`touched_at_start!`,
// lib.rs). Issue 48, item 1; BENCHMARKS.md, "Start-up";
// bench/FINDINGS-startup.md.

#[unsafe(link_section = ".text.startup")]
extern "C" fn constructor() {
    let _e = os::KeepErrno::new();
    alloc::init();
    let interposed = os::interpose::detect();
    if !interposed {
        // `reallocarray` must then call the process's `realloc`.
        alloc::not_ours(os::dl::global(c"realloc"));
    }
    thread::on_load(interposed);
    crate::deepbind::init();
    crate::profile::at_load();
}

/// Called by the exported `dlopen` before glibc's while
/// `os::spawner::WATCH` is set (see there), with `dlopen`'s `file`: the
/// thread layer may have to start a spawner for a CPython being loaded.
/// x86_64 only, as that `dlopen` is.
#[cfg(target_arch = "x86_64")]
extern "C" fn before_dlopen(file: *const c_char) {
    if file.is_null() {
        return;
    }
    // SAFETY: `dlopen`'s caller passes NULL or a NUL-terminated path.
    let name = unsafe { core::ffi::CStr::from_ptr(file) }.to_bytes();
    thread::before_dlopen(name);
}

#[unsafe(link_section = ".text.startup")]
extern "C" fn destructor() {
    thread::on_unload();
}

#[cfg(not(test))]
#[used]
#[unsafe(link_section = ".init_array")]
static CONSTRUCTOR: extern "C" fn() = constructor;

#[cfg(not(test))]
#[used]
#[unsafe(link_section = ".fini_array")]
static DESTRUCTOR: extern "C" fn() = destructor;
