//! Debian sid's CPythons (python3.13, python3.14, python3.15 as Debian's
//! users run them), in the root filesystem that scripts/test-deps.sh builds
//! once with debootstrap and keeps outside the checkout.
//!
//! This machine cannot run sid's binaries (its glibc is older), so a test
//! runs them chrooted into that root: [`Sid::enter`] gives a [`Cmd`] a
//! `pre_exec` that moves the child into a mount namespace of its own, binds
//! `/proc`, `/dev`, `/sys`, `/tmp` and the checkout (read-only) at the same
//! paths inside the root, and chroots there. Paths are thus the same on
//! both sides: `LD_PRELOAD` names the checkout's libmemshim.so, a script is
//! `tests/fixtures/...`, a socket directory is `/tmp/ms-...`; and since
//! there is no pid namespace, the child's pid is its own, so every
//! pid-based helper (`/proc/PID/...`, memshim-ctl, which finds the socket
//! through `/proc/PID/root`) works unchanged.
//!
//! Where the root is missing or cannot be entered (not built, not root,
//! `unshare` refused), [`sid`] says why, and the tests print
//! `SKIP: <reason>` (with test-deps' own reason when it wrote one).

use crate::Cmd;
use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, OnceLock};

/// The minor versions of Debian sid's interpreters in the root.
pub const MINORS: [&str; 3] = ["3.13", "3.14", "3.15"];

/// Where the root is: `MEMSHIM_TEST_SID_ROOT`, else where
/// scripts/test-deps.sh builds it,
/// `${MEMSHIM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/memshim}/debian-sid`.
pub fn root_path() -> PathBuf {
    if let Some(p) = std::env::var_os("MEMSHIM_TEST_SID_ROOT") {
        return PathBuf::from(p);
    }
    crate::cache_dir().join("debian-sid")
}

/// The sid root, ready to enter.
pub struct Sid {
    /// Its directory on this machine.
    pub path: PathBuf,
    /// `key=value` lines of its manifest (`memshim-manifest`, written by
    /// test-deps); empty for a root made by hand.
    manifest: Vec<(String, String)>,
    /// (minor, full version) of each interpreter found in it, as it
    /// reports itself.
    pythons: Vec<(String, String)>,
    enter: Arc<Enter>,
}

/// What the child does before exec, prepared in the parent: a `pre_exec`
/// closure must not allocate (another thread of the test may have held the
/// allocator's lock at the fork).
struct Enter {
    root: CString,
    /// (source, target inside the root seen from here, read-only).
    binds: Vec<(CString, CString, bool)>,
}

impl Sid {
    /// `key` of the manifest.
    pub fn manifest(&self, key: &str) -> Option<&str> {
        self.manifest
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// (minor, full version) of each interpreter in the root.
    pub fn pythons(&self) -> &[(String, String)] {
        &self.pythons
    }

    /// The path on this machine of `inside`, a path inside the root.
    pub fn host_path(&self, inside: &Path) -> PathBuf {
        self.path.join(inside.strip_prefix("/").unwrap_or(inside))
    }

    /// `program args...` (a path inside the root) run inside the root.
    pub fn cmd<S: AsRef<OsStr>>(
        &self,
        program: impl AsRef<OsStr>,
        args: impl IntoIterator<Item = S>,
    ) -> Cmd {
        self.enter(Cmd::new(program, args))
    }

    /// `cmd`, run inside the root: its program is a path inside the root,
    /// its working directory the one it would have here (the checkout's,
    /// by default). Runs after `cmd`'s own `pre_exec`s.
    pub fn enter(&self, mut cmd: Cmd) -> Cmd {
        let e = self.enter.clone();
        // SAFETY: the closure runs in the forked child before exec and only
        // makes system calls on memory prepared before the fork (no
        // allocation, no lock).
        unsafe {
            cmd.command().pre_exec(move || e.run());
        }
        cmd
    }
}

impl Enter {
    /// In the child: a mount namespace of its own, where nothing it mounts
    /// propagates back; the binds; chroot; the same working directory.
    fn run(&self) -> std::io::Result<()> {
        let fail = |step: &[u8]| {
            let e = std::io::Error::last_os_error();
            // SAFETY: write(2) of a static buffer to stderr, for the
            // person reading the test's output; the errno goes to the parent.
            unsafe {
                let m = b"memshim-tests: entering the Debian sid root failed at ";
                libc::write(2, m.as_ptr().cast(), m.len());
                libc::write(2, step.as_ptr().cast(), step.len());
            }
            Err(e)
        };
        let null = std::ptr::null::<libc::c_char>();
        // SAFETY: system calls on NUL-terminated strings that live in
        // `self`, prepared by the parent.
        unsafe {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return fail(b"unshare(CLONE_NEWNS)\n");
            }
            if libc::mount(
                null,
                c"/".as_ptr(),
                null,
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                return fail(b"making / private\n");
            }
            for (src, dst, ro) in &self.binds {
                if libc::mount(
                    src.as_ptr(),
                    dst.as_ptr(),
                    null,
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ) != 0
                {
                    return fail(b"a bind mount\n");
                }
                if *ro
                    && libc::mount(
                        null,
                        dst.as_ptr(),
                        null,
                        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                        std::ptr::null(),
                    ) != 0
                {
                    return fail(b"a read-only remount\n");
                }
            }
            let mut cwd = [0u8; 4096];
            if libc::syscall(libc::SYS_getcwd, cwd.as_mut_ptr(), cwd.len()) < 0 {
                return fail(b"getcwd\n");
            }
            if libc::chroot(self.root.as_ptr()) != 0 {
                return fail(b"chroot\n");
            }
            if libc::chdir(cwd.as_ptr().cast()) != 0 {
                return fail(b"chdir to the same directory inside\n");
            }
        }
        Ok(())
    }
}

/// The root, or why it cannot be used (for a SKIP line). Found, prepared
/// and tried once per test process.
pub fn sid() -> Result<&'static Sid, String> {
    static S: OnceLock<Result<Sid, String>> = OnceLock::new();
    S.get_or_init(find).as_ref().map_err(Clone::clone)
}

/// [`sid`], or `None` after a `SKIP: <what>: <reason>` line on stderr
/// ([`crate::skip`]).
pub fn sid_or_skip(what: &str) -> Option<&'static Sid> {
    match sid() {
        Ok(s) => Some(s),
        Err(why) => {
            crate::skip(format_args!("{what}: {why}"));
            None
        }
    }
}

fn find() -> Result<Sid, String> {
    let path = root_path();
    if !path.join("usr/bin").is_dir() {
        // test-deps' reason, when it gave up on building it.
        let mut note = path.as_os_str().to_owned();
        note.push(".unavailable");
        let why = std::fs::read_to_string(&note)
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| {
                "not built: scripts/test-deps.sh builds it (make test-deps, as root)".into()
            });
        return Err(format!("Debian sid root {}: {why}", path.display()));
    }
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if uid != 0 {
        return Err(format!(
            "Debian sid root {}: the tests run as uid {uid}; entering it needs root (unshare, mount, chroot)",
            path.display()
        ));
    }
    let manifest = std::fs::read_to_string(path.join("memshim-manifest"))
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let cstr = |p: &Path| CString::new(p.as_os_str().as_bytes()).expect("a path without NUL");
    let mut binds = vec![];
    let checkout = crate::root();
    for (src, ro) in [
        (PathBuf::from("/proc"), false),
        (PathBuf::from("/dev"), false),
        (PathBuf::from("/sys"), false),
        (PathBuf::from("/tmp"), false),
        (checkout.clone(), true),
    ] {
        // A checkout under /tmp is inside the /tmp bind already.
        if src == checkout && checkout.starts_with("/tmp") {
            continue;
        }
        let dst = path.join(src.strip_prefix("/").unwrap());
        std::fs::create_dir_all(&dst)
            .map_err(|e| format!("Debian sid root: creating {}: {e}", dst.display()))?;
        binds.push((cstr(&src), cstr(&dst), ro));
    }
    let mut sid = Sid {
        enter: Arc::new(Enter {
            root: cstr(&path),
            binds,
        }),
        path,
        manifest,
        pythons: vec![],
    };
    // Entering it at all: unshare or a mount may be refused (a container
    // without CAP_SYS_ADMIN).
    let tried = sid
        .enter(Cmd::new("/bin/true", Vec::<&str>::new()))
        .command()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status();
    match tried {
        Ok(s) if s.success() => {}
        Ok(s) => {
            return Err(format!(
                "Debian sid root {}: /bin/true inside it ended with {s}",
                sid.path.display()
            ));
        }
        Err(e) => {
            return Err(format!(
                "Debian sid root {}: cannot enter it (unshare, bind mounts of /proc /dev /sys /tmp and the checkout, chroot): {e}",
                sid.path.display()
            ));
        }
    }
    for minor in MINORS {
        let exe = format!("/usr/bin/python{minor}");
        if !sid.host_path(Path::new(&exe)).exists() {
            continue;
        }
        let o = sid
            .enter(Cmd::new(
                &exe,
                ["-c", "import platform; print(platform.python_version())"],
            ))
            .run();
        if o.code != 0 {
            return Err(format!(
                "Debian sid root {}: {exe} -c ... failed: {o:?}",
                sid.path.display()
            ));
        }
        sid.pythons
            .push((minor.to_owned(), o.stdout.trim().to_owned()));
    }
    Ok(sid)
}
