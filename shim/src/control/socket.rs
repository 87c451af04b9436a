//! The socket file and its directory: every system call of the endpoint.
//!
//! Layout: `<dir>/<pid>-<starttime>.sock`, where `<dir>` is
//! `MEMSHIM_SOCKET_DIR` or `/tmp/memshim-<euid>`, `<pid>` the pid in the
//! process's own pid namespace, and `<starttime>` field 22 of
//! `/proc/self/stat`, so a socket left by a dead process is never mistaken
//! for a new process that got the same pid.
//!
//! The directory must be a real directory (not a symlink), owned by our
//! effective uid, with no permissions for group or others. We create it
//! 0700 if it is missing and refuse to use it otherwise. Because nobody else
//! can write into it, the names in it are ours to create and remove.

use core::ffi::CStr;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;

/// Why the endpoint could not be created (for `MEMSHIM_VERBOSE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirError {
    /// mkdir failed for another reason than "exists".
    Create(i32),
    /// The path is a symlink (or a component loop).
    Symlink,
    /// Not a directory.
    NotDir,
    /// Owned by another uid.
    Owner(u32),
    /// Group or others have permissions on it.
    Mode(u32),
    /// open/fstat failed.
    Open(i32),
}

impl core::fmt::Display for DirError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            DirError::Create(e) => write!(f, "cannot create it (errno {e})"),
            DirError::Symlink => f.write_str("it is a symbolic link"),
            DirError::NotDir => f.write_str("it is not a directory"),
            DirError::Owner(u) => write!(f, "it is owned by uid {u}, not by this process's uid"),
            DirError::Mode(m) => write!(
                f,
                "its mode is {m:04o}; group and others must have no access"
            ),
            DirError::Open(e) => write!(f, "cannot open it (errno {e})"),
        }
    }
}

fn errno() -> i32 {
    crate::sys::errno()
}

/// The effective uid.
pub fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// The socket directory in force, without allocating (the destructor
/// uses it).
pub fn dir_path_static() -> crate::sys::StackBuf<96> {
    let mut b = crate::sys::StackBuf::<96>::new();
    match crate::options::socket_dir() {
        Some(d) => b.push(d),
        None => {
            use core::fmt::Write;
            let _ = write!(b, "/tmp/memshim-{}", euid());
        }
    }
    b
}

/// The socket directory in force.
pub fn dir_path() -> Vec<u8> {
    dir_path_static().as_bytes().to_vec()
}

/// Field 22 of `/proc/self/stat`: start time in clock ticks after boot.
///
/// Read as `/proc/./self/stat`, which the kernel resolves to the same file.
/// User-mode emulators (qemu-user, which runs arm64 containers on x86_64
/// hosts through binfmt_misc) rewrite only the literal `/proc/self/stat`
/// and report their own start-up time there, a few ticks later than the
/// kernel's; the socket name would then never match what memshim-ctl reads
/// from `/proc/<pid>/stat`. The aarch64 smoke test runs under qemu-user.
pub fn starttime() -> u64 {
    let mut buf = [0u8; 1024];
    let Some(len) = crate::sys::read_file(c"/proc/./self/stat", &mut buf) else {
        return 0;
    };
    parse_starttime(&buf[..len]).unwrap_or(0)
}

/// Field 22 of a `/proc/<pid>/stat` line (the command in field 2 may hold
/// spaces and parentheses, so fields are counted after the last `)`).
pub fn parse_starttime(stat: &[u8]) -> Option<u64> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let mut fields = stat[close + 1..]
        .split(|&b| b == b' ')
        .filter(|f| !f.is_empty());
    crate::sys::parse_u64(fields.nth(19)?)
}

/// Makes sure `dir` is a directory only we can use: creates it 0700 if
/// missing, refuses a symlink, another owner, or group/other permissions.
pub fn ensure_dir(dir: &[u8]) -> Result<(), DirError> {
    let c = CString::new(dir).map_err(|_| DirError::NotDir)?;
    // SAFETY: `c` is NUL-terminated.
    let created = unsafe { libc::mkdir(c.as_ptr(), 0o700) } == 0;
    if !created && errno() != libc::EEXIST {
        return Err(DirError::Create(errno()));
    }
    // O_NOFOLLOW: a symlink in the last component fails with ELOOP instead
    // of being followed to a directory someone else controls.
    // SAFETY: `c` is NUL-terminated; flags are constants.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(match errno() {
            libc::ELOOP => DirError::Symlink,
            libc::ENOTDIR => DirError::NotDir,
            e => DirError::Open(e),
        });
    }
    let r = check_dir_fd(fd, created);
    // SAFETY: closing the descriptor opened above.
    unsafe { libc::close(fd) };
    r
}

fn check_dir_fd(fd: i32, created: bool) -> Result<(), DirError> {
    // SAFETY: `st` is a valid out-pointer.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: fstat on our own descriptor.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(DirError::Open(errno()));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(DirError::NotDir);
    }
    if st.st_uid != euid() {
        return Err(DirError::Owner(st.st_uid));
    }
    let mode = st.st_mode & 0o7777;
    if created && mode != 0o700 {
        // A umask that removed owner bits: we just made it, fix it.
        // SAFETY: fchmod on our own directory descriptor.
        unsafe { libc::fchmod(fd, 0o700) };
        return Ok(());
    }
    if mode & 0o077 != 0 {
        return Err(DirError::Mode(mode));
    }
    Ok(())
}

/// `<dir>/<pid>-<starttime>.sock` as a C string.
pub fn socket_path(dir: &[u8], pid: i32, starttime: u64) -> CString {
    let mut p = dir.to_vec();
    while p.len() > 1 && p.ends_with(b"/") {
        p.pop();
    }
    p.extend_from_slice(format!("/{pid}-{starttime}.sock").as_bytes());
    CString::new(p).unwrap_or_default()
}

/// (st_dev, st_ino) of the file at `path` without following symlinks, if it
/// is a socket.
pub fn socket_file_id(path: &CStr) -> Option<(u64, u64)> {
    // SAFETY: `st` is a valid out-pointer.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated.
    if unsafe { libc::lstat(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    (st.st_mode & libc::S_IFMT == libc::S_IFSOCK).then_some((st.st_dev, st.st_ino))
}

/// Removes `path` (our own socket name in our own directory).
pub fn unlink(path: &CStr) {
    // SAFETY: `path` is NUL-terminated.
    unsafe { libc::unlink(path.as_ptr()) };
}

/// Creates, binds (mode 0600) and listens on a nonblocking, close-on-exec
/// socket at `path`. Returns the descriptor.
pub fn listen(path: &CStr) -> Option<i32> {
    let bytes = path.to_bytes();
    let mut addr: libc::sockaddr_un = {
        // SAFETY: sockaddr_un is plain old data; all-zero is valid.
        unsafe { core::mem::zeroed() }
    };
    if bytes.len() >= addr.sun_path.len() {
        return None;
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: plain socket creation.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return None;
    }
    let fd = super::fds::move_high(fd);
    // A file left at our exact name can only be ours from before (same pid
    // and start time): remove it so bind succeeds.
    unlink(path);
    let len = (core::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    // SAFETY: `addr` is a valid sockaddr_un of `len` bytes; `path` is
    // NUL-terminated and the mode a constant.
    let ok = unsafe {
        libc::bind(fd, (&raw const addr).cast(), len) == 0
            && libc::chmod(path.as_ptr(), 0o600) == 0
            && libc::listen(fd, 64) == 0
    };
    if !ok {
        unlink(path);
        // SAFETY: closing the socket created above.
        unsafe { libc::close(fd) };
        return None;
    }
    Some(fd)
}

/// Whether `fd` is a Unix socket whose local address is `path`: our
/// listener, or a connection accepted on it. Our socket name is unique to
/// this process (pid and start time), so no socket of the application can
/// pass. Used after recording a new descriptor, to catch a `dup2`/
/// `close_range` by the application that replaced the number in between.
pub fn bound_to(fd: i32, path: &CStr) -> bool {
    let mut addr: libc::sockaddr_un = {
        // SAFETY: sockaddr_un is plain old data; all-zero is valid.
        unsafe { core::mem::zeroed() }
    };
    let mut len = core::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: `addr`/`len` describe a writable sockaddr_un.
    if unsafe { libc::getsockname(fd, (&raw mut addr).cast(), &mut len) } != 0
        || addr.sun_family != libc::AF_UNIX as libc::sa_family_t
    {
        return false;
    }
    let want = path.to_bytes();
    let got = addr
        .sun_path
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8);
    got.eq(want.iter().copied())
}

/// Accepts one connection (nonblocking, close-on-exec), if one is waiting.
pub fn accept(listener: i32) -> Result<i32, i32> {
    // SAFETY: accept4 with null address pointers is allowed.
    let fd = unsafe {
        libc::accept4(
            listener,
            core::ptr::null_mut(),
            core::ptr::null_mut(),
            libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
        )
    };
    if fd < 0 { Err(errno()) } else { Ok(fd) }
}

/// The uid of the peer at connect time (`SO_PEERCRED`). The peer pid is
/// not used: it reads 0 when the client is in an outer pid namespace.
pub fn peer_uid(fd: i32) -> Option<u32> {
    // SAFETY: ucred is plain old data.
    let mut cred: libc::ucred = unsafe { core::mem::zeroed() };
    let mut len = core::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred`/`len` describe a buffer of the size SO_PEERCRED fills.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred.uid)
}

/// Nonblocking read into `buf`: `Ok(0)` is end of file, `Err(EAGAIN)` is
/// "nothing now".
pub fn recv(fd: i32, buf: &mut [u8]) -> Result<usize, i32> {
    // SAFETY: the pointer and length describe `buf`.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if n < 0 { Err(errno()) } else { Ok(n as usize) }
}

/// Nonblocking write that never raises SIGPIPE. Returns bytes written.
pub fn send(fd: i32, buf: &[u8]) -> Result<usize, i32> {
    // SAFETY: the pointer and length describe `buf`.
    let n = unsafe {
        libc::send(
            fd,
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 { Err(errno()) } else { Ok(n as usize) }
}

/// Path bytes as an `OsStr`-style slice, for messages.
pub fn show(path: &CStr) -> &str {
    std::ffi::OsStr::from_bytes(path.to_bytes())
        .to_str()
        .unwrap_or("?")
}
