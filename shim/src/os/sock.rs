//! The control socket and its directory: every socket system call of the
//! endpoint, made without libc (`raw.rs`), so none touches `errno`. The
//! descriptors are [`Owned`] (see `fd.rs`).
//!
//! The directory must be a real directory (not a symbolic link), owned by
//! our effective uid, with no permissions for group or others. We create it
//! 0700 if it is missing and refuse it otherwise. Because nobody else can
//! write into it, the names in it are ours to create and remove.

use super::fd::{self, Owned};
use super::{euid, raw};
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
    let created = match raw::mkdir(dir, 0o700) {
        Ok(()) => true,
        Err(libc::EEXIST) => false,
        Err(e) => return Err(DirError::Create(e)),
    };
    let mut opened = fd::open_dir(dir);
    if created && matches!(opened, Err(libc::EACCES)) {
        // A umask that removed the owner's bits (0700, 0777): the new
        // directory cannot be opened, by this process or any later one of
        // its uid. We just made it: give it its mode and open it again.
        let _ = raw::chmod(dir, 0o700);
        opened = fd::open_dir(dir);
    }
    let d = opened.map_err(|e| match e {
        libc::ELOOP => DirError::Symlink,
        libc::ENOTDIR => DirError::NotDir,
        e => DirError::Open(e),
    })?;
    let fdn = d.fd().ok_or(DirError::Open(libc::EBADF))?;
    let st = raw::fstat(fdn).map_err(DirError::Open)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(DirError::NotDir);
    }
    if st.st_uid != euid() {
        return Err(DirError::Owner(st.st_uid));
    }
    let mode = st.st_mode & 0o7777;
    if created && mode != 0o700 {
        // A umask that removed owner bits: we just made it, fix it.
        let _ = raw::fchmod(fdn, 0o700);
    } else if mode & 0o077 != 0 {
        return Err(DirError::Mode(mode));
    }
    Ok(d)
}

/// `lstat` of `path`.
fn lstat(path: &CStr) -> Option<libc::stat> {
    raw::stat(path, false).ok()
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
    let _ = raw::unlink(path);
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
    // A socket left at our exact name is ours from before: the name holds
    // our pid, start time and pid namespace.
    if socket_file_id(path).is_some() {
        unlink(path);
    }
    if raw::bind(s, &a, len).is_err() {
        return None; // `sock` is dropped: closed if still ours
    }
    // `s` is checked again before `listen`: the application could have
    // replaced the number.
    let ok =
        raw::chmod(path, 0o600).is_ok() && sock.fd().is_some_and(|s| raw::listen(s, 64).is_ok());
    if !ok {
        unlink(path);
        return None;
    }
    Some(sock)
}

/// Whether connecting to `addr` (as for [`listen`]) is refused: a socket
/// file nobody listens on. Shim's thread.
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
    raw::connect(s, &a, len) == Err(libc::ECONNREFUSED)
}

/// Whether `fd` is a Unix socket whose local address is `addr`: our
/// listener, or a connection accepted on it. The address holds our pid,
/// start time and pid namespace, so no socket of the application's can
/// pass.
pub fn bound_to(fd: i32, addr: &[u8]) -> bool {
    let Ok(a) = raw::getsockname(fd) else {
        return false;
    };
    if a.sun_family != libc::AF_UNIX as libc::sa_family_t {
        return false;
    }
    let got = a.sun_path.iter().take_while(|&&c| c != 0).map(|&c| c as u8);
    got.eq(addr.iter().copied())
}

/// The uid of the peer at connect time (`SO_PEERCRED`). The peer pid is not
/// used: it reads 0 when the client is in an outer pid namespace.
pub fn peer_uid(fd: i32) -> Option<u32> {
    raw::peer_cred(fd).ok().map(|cred| cred.uid)
}

/// Nonblocking read: `Ok(0)` is end of file, `Err(EAGAIN)` is "nothing now".
pub fn recv(fd: i32, buf: &mut [u8]) -> Result<usize, i32> {
    raw::recv(fd, buf, libc::MSG_DONTWAIT)
}

/// Nonblocking write that never raises SIGPIPE. Returns the bytes written.
pub fn send(fd: i32, buf: &[u8]) -> Result<usize, i32> {
    raw::send(fd, buf, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
}
