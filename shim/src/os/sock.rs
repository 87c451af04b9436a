//! The control socket and its directory: every socket system call of the
//! endpoint. The descriptors are [`Owned`] (see `fd.rs`).
//!
//! The directory must be a real directory (not a symbolic link), owned by
//! our effective uid, with no permissions for group or others. We create it
//! 0700 if it is missing and refuse it otherwise. Because nobody else can
//! write into it, the names in it are ours to create and remove.

use super::fd::{self, Owned};
use super::{KeepErrno, errno, euid};
use core::ffi::CStr;

/// Why the socket directory is refused (for `MEMSHIM_VERBOSE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirError {
    /// mkdir failed for another reason than "exists".
    Create(i32),
    /// The path is a symbolic link.
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

/// Makes sure `dir` is a directory only we can use: creates it 0700 if
/// missing, refuses a symbolic link, another owner, or group/other
/// permissions. Returns it open.
pub fn ensure_dir(dir: &CStr) -> Result<Owned, DirError> {
    let _e = KeepErrno::new();
    // SAFETY: `dir` is NUL-terminated.
    let created = unsafe { libc::mkdir(dir.as_ptr(), 0o700) } == 0;
    if !created && errno() != libc::EEXIST {
        return Err(DirError::Create(errno()));
    }
    let d = fd::open_dir(dir).map_err(|e| match e {
        libc::ELOOP => DirError::Symlink,
        libc::ENOTDIR => DirError::NotDir,
        e => DirError::Open(e),
    })?;
    let fdn = d.fd().ok_or(DirError::Open(libc::EBADF))?;
    // SAFETY: `st` is a valid out-pointer.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: fstat on our own descriptor.
    if unsafe { libc::fstat(fdn, &mut st) } != 0 {
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
        unsafe { libc::fchmod(fdn, 0o700) };
    } else if mode & 0o077 != 0 {
        return Err(DirError::Mode(mode));
    }
    Ok(d)
}

/// `lstat` of `path`, keeping errno.
fn lstat(path: &CStr) -> Option<libc::stat> {
    let _e = KeepErrno::new();
    // SAFETY: `st` is a valid out-pointer.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated.
    (unsafe { libc::lstat(path.as_ptr(), &mut st) } == 0).then_some(st)
}

/// (st_dev, st_ino) of the file at `path` without following symbolic
/// links, if it is a socket.
pub fn socket_file_id(path: &CStr) -> Option<(u64, u64)> {
    let st = lstat(path)?;
    (st.st_mode & libc::S_IFMT == libc::S_IFSOCK).then_some((st.st_dev, st.st_ino))
}

/// (st_dev, st_ino) of this thread's root directory: it changes when the
/// program `chroot`s.
pub fn root_id() -> Option<(u64, u64)> {
    lstat(c"/").map(|st| (st.st_dev, st.st_ino))
}

/// Removes `path` (our own socket name in our own directory).
/// Allocation-free.
pub fn unlink(path: &CStr) {
    let _e = KeepErrno::new();
    // SAFETY: `path` is NUL-terminated.
    unsafe { libc::unlink(path.as_ptr()) };
}

fn sockaddr(addr: &[u8]) -> Option<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain old data; all-zero is valid.
    let mut a: libc::sockaddr_un = unsafe { core::mem::zeroed() };
    if addr.len() >= a.sun_path.len() || addr.contains(&0) {
        return None;
    }
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in a.sun_path.iter_mut().zip(addr) {
        *d = *s as libc::c_char;
    }
    let len = (core::mem::size_of::<libc::sa_family_t>() + addr.len() + 1) as libc::socklen_t;
    Some((a, len))
}

/// Creates a nonblocking, close-on-exec socket, binds it to `addr` (a path
/// of at most `sun_path` bytes; `path` is the same file by its full name,
/// for chmod), gives it mode 0600 and listens. On failure nothing of ours
/// is left open, and the name is removed only if we bound it.
pub fn listen(addr: &[u8], path: &CStr) -> Option<Owned> {
    let (a, len) = sockaddr(addr)?;
    let sock = fd::unix_socket()?;
    let s = sock.fd()?;
    let _e = KeepErrno::new();
    // A socket left at our exact name is ours from before: the name holds
    // our pid, start time and pid namespace.
    if socket_file_id(path).is_some() {
        unlink(path);
    }
    // SAFETY: `a` is a valid sockaddr_un of `len` bytes.
    if unsafe { libc::bind(s, (&raw const a).cast(), len) } != 0 {
        return None; // `sock` is dropped: closed if still ours
    }
    // SAFETY: `path` is NUL-terminated; the mode is a constant.
    let ok = unsafe { libc::chmod(path.as_ptr(), 0o600) == 0 }
        && sock.fd().is_some_and(|s| {
            // SAFETY: `s` is ours (checked again: the application could
            // have replaced the number); listen takes no pointer.
            (unsafe { libc::listen(s, 64) }) == 0
        });
    if !ok {
        unlink(path);
        return None;
    }
    Some(sock)
}

/// Whether connecting to `addr` (as for [`listen`]) is refused: a socket
/// file nobody listens on. Made with the `connect` system call through
/// `syscall`, which the library imports anyway (one more imported symbol
/// is a look-up in every process's start-up). Shim's thread.
pub fn refuses_connection(addr: &[u8]) -> bool {
    let Some((a, len)) = sockaddr(addr) else {
        return false;
    };
    let Some(sock) = fd::unix_socket() else {
        return false;
    };
    let Some(s) = sock.fd() else {
        return false;
    };
    let _e = KeepErrno::new();
    // SAFETY: `a` is a valid sockaddr_un of `len` bytes; `s` is our socket.
    let r = unsafe {
        libc::syscall(
            libc::SYS_connect,
            libc::c_long::from(s),
            (&raw const a) as libc::c_long,
            libc::c_long::from(len),
        )
    };
    r != 0 && super::errno() == libc::ECONNREFUSED
}

/// Whether `fd` is a Unix socket whose local address is `addr`: our
/// listener, or a connection accepted on it. The address holds our pid,
/// start time and pid namespace, so no socket of the application's can
/// pass.
pub fn bound_to(fd: i32, addr: &[u8]) -> bool {
    let _e = KeepErrno::new();
    // SAFETY: sockaddr_un is plain old data; all-zero is valid.
    let mut a: libc::sockaddr_un = unsafe { core::mem::zeroed() };
    let mut len = core::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: `a`/`len` describe a writable sockaddr_un.
    if unsafe { libc::getsockname(fd, (&raw mut a).cast(), &mut len) } != 0
        || a.sun_family != libc::AF_UNIX as libc::sa_family_t
    {
        return false;
    }
    let got = a.sun_path.iter().take_while(|&&c| c != 0).map(|&c| c as u8);
    got.eq(addr.iter().copied())
}

/// The uid of the peer at connect time (`SO_PEERCRED`). The peer pid is not
/// used: it reads 0 when the client is in an outer pid namespace.
pub fn peer_uid(fd: i32) -> Option<u32> {
    let _e = KeepErrno::new();
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

/// Nonblocking read: `Ok(0)` is end of file, `Err(EAGAIN)` is "nothing now".
pub fn recv(fd: i32, buf: &mut [u8]) -> Result<usize, i32> {
    let _e = KeepErrno::new();
    // SAFETY: the pointer and length describe `buf`.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if n < 0 { Err(errno()) } else { Ok(n as usize) }
}

/// Nonblocking write that never raises SIGPIPE. Returns the bytes written.
pub fn send(fd: i32, buf: &[u8]) -> Result<usize, i32> {
    let _e = KeepErrno::new();
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
