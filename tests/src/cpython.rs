//! The CPythons the tests run: pyenv's on this machine, the default
//! `python3`, and Debian sid's in the root scripts/test-deps.sh builds
//! (re-exported by py.rs, where the `python` family finds them).

use crate::sid::{self, Sid};
use crate::{Cmd, pyenv_pythons};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// `cmd` under the shim, its endpoint on from the start, its socket in `dir`.
pub(crate) fn endpoint_on(cmd: Cmd, dir: &Path) -> Cmd {
    cmd.shimmed()
        .env("MEMSHIM_CONTROL", "on")
        .env("MEMSHIM_SOCKET_DIR", dir)
}

/// A CPython the tests can run: one of pyenv's on this machine, the
/// default `python3`, or one of Debian sid's in the root that
/// scripts/test-deps.sh builds (run chrooted there, [`crate::sid`]).
#[derive(Clone)]
pub struct Cpython {
    /// For messages: "3.13.0 (pyenv)", "3.13.18 (sid)", "3.11.7 (python3)".
    pub label: String,
    /// Its minor version, "3.13".
    pub minor: String,
    /// Its full version, "3.13.18", as `platform.python_version()` says.
    pub version: String,
    /// The executable, as the process sees it (inside the root for sid's).
    pub exe: PathBuf,
    /// The root it runs in; `None`: this machine's.
    sid: Option<&'static Sid>,
}

impl std::fmt::Debug for Cpython {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at {}", self.label, self.exe.display())
    }
}

impl Cpython {
    fn new(version: &str, origin: &str, exe: PathBuf, sid: Option<&'static Sid>) -> Cpython {
        let minor = version.split('.').take(2).collect::<Vec<_>>().join(".");
        Cpython {
            label: format!("{version} ({origin})"),
            minor,
            version: version.to_owned(),
            exe,
            sid,
        }
    }

    /// Where it comes from: "pyenv", "sid" or "python3".
    pub fn origin(&self) -> &str {
        self.label
            .rsplit_once(" (")
            .map_or("", |(_, o)| o.trim_end_matches(')'))
    }

    /// Short and unique among [`cpythons`], for socket directory names:
    /// "3.13-pyenv", "3.13-sid".
    pub fn tag(&self) -> String {
        format!("{}-{}", self.minor, self.origin())
    }

    /// (major, minor, patch).
    pub fn parsed(&self) -> (u32, u32, u32) {
        let mut it = self.version.split('.').map(|p| {
            p.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .unwrap_or(0)
        });
        (
            it.next().unwrap_or(0),
            it.next().unwrap_or(0),
            it.next().unwrap_or(0),
        )
    }

    /// Debian sid's root it runs in, if it is one of sid's.
    pub fn sid(&self) -> Option<&'static Sid> {
        self.sid
    }

    /// `cmd` run where this interpreter runs: as it is for this machine's,
    /// chrooted into the sid root for sid's (its program then a path as
    /// seen from inside: the checkout, `/tmp` and `/usr/bin/python3.X`).
    pub fn enter(&self, cmd: Cmd) -> Cmd {
        match self.sid {
            Some(s) => s.enter(cmd),
            None => cmd,
        }
    }

    /// `python args...`, without the shim.
    pub fn cmd<S: AsRef<OsStr>>(&self, args: impl IntoIterator<Item = S>) -> Cmd {
        self.enter(Cmd::new(&self.exe, args))
    }

    /// `python script args...` under the shim with its control endpoint on.
    pub fn shimmed(&self, script: &Path, args: &[&str], dir: &Path) -> Cmd {
        let mut a: Vec<&OsStr> = vec![script.as_os_str()];
        a.extend(args.iter().map(OsStr::new));
        endpoint_on(self.cmd(a), dir)
    }

    /// `python -c code` under the shim with its control endpoint on.
    pub fn shimmed_c(&self, code: &str, dir: &Path) -> Cmd {
        endpoint_on(self.cmd(["-c", code]), dir)
    }

    /// Its `libpython3.X.so.1.0` and the `PYTHONHOME` an embedder sets for
    /// it, as the process sees them; `None` for a build without one.
    pub fn embedding(&self) -> Option<(PathBuf, PathBuf)> {
        let name = format!("libpython{}.so.1.0", self.minor);
        match self.sid {
            None => {
                let home = self.exe.parent()?.parent()?.to_path_buf();
                let lib = home.join("lib").join(&name);
                lib.exists().then_some((lib, home))
            }
            Some(s) => {
                // Debian's multiarch directory: /usr/lib/x86_64-linux-gnu.
                let lib = std::fs::read_dir(s.host_path(Path::new("/usr/lib")))
                    .ok()?
                    .flatten()
                    .map(|e| Path::new("/usr/lib").join(e.file_name()).join(&name))
                    .find(|p| s.host_path(p).exists())?;
                Some((lib, PathBuf::from("/usr")))
            }
        }
    }
}

/// The CPython minor versions the bridge serves
/// (`memshim_proto::PYTHON_SERVED`).
pub const SUPPORTED: [&str; 8] = ["3.8", "3.9", "3.10", "3.11", "3.12", "3.13", "3.14", "3.15"];

/// The minor versions the tests expect from pyenv here (3.14 and 3.15 come
/// from Debian sid).
const FROM_PYENV: [&str; 6] = ["3.8", "3.9", "3.10", "3.11", "3.12", "3.13"];

/// Every CPython the tests run, oldest first: pyenv's 3.8-3.13 on this
/// machine, then Debian sid's 3.13, 3.14 and 3.15 in the root
/// scripts/test-deps.sh builds. Absent ones are named on stderr with
/// `SKIP:` ([`crate::skip`]), with the reason for sid's.
pub fn cpythons() -> Vec<Cpython> {
    let all = pyenv_pythons();
    let mut out = vec![];
    for want in FROM_PYENV {
        match all
            .iter()
            .find(|(v, _)| v.starts_with(&format!("{want}.")) && !v.contains('t'))
        {
            Some((v, exe)) => out.push(Cpython::new(v, "pyenv", exe.clone(), None)),
            None => crate::skip(format_args!(
                "CPython {want} is not installed under ~/.pyenv/versions"
            )),
        }
    }
    out.extend(sid_cpythons(&sid::MINORS));
    out
}

/// Debian sid's CPythons of the `minors` asked for, from the root; none,
/// with a SKIP line naming the reason, when the root is unavailable.
pub fn sid_cpythons(minors: &[&str]) -> Vec<Cpython> {
    let Some(s) = sid::sid_or_skip(&format!("CPython {} of Debian sid", minors.join(", "))) else {
        return vec![];
    };
    let mut out = vec![];
    for want in minors {
        match s.pythons().iter().find(|(m, _)| m == want) {
            Some((_, v)) => out.push(Cpython::new(
                v,
                "sid",
                PathBuf::from(format!("/usr/bin/python{want}")),
                Some(s),
            )),
            None => crate::skip(format_args!(
                "CPython {want} of Debian sid: no /usr/bin/python{want} in {}",
                s.path.display()
            )),
        }
    }
    out
}

/// The default `python3` of this machine ([`crate::python`]).
pub fn default_python() -> Cpython {
    let exe = crate::python();
    let o = Cmd::new(
        &exe,
        ["-c", "import platform; print(platform.python_version())"],
    )
    .run();
    assert_eq!(o.code, 0, "{}: {o:?}", exe.display());
    Cpython::new(o.stdout.trim(), "python3", exe, None)
}

/// The CPythons an embedder test loads (`tests/fixtures/py_local.c`): the
/// newest of pyenv's that has a libpython, and each of Debian sid's.
pub fn embeddable_cpythons() -> Vec<Cpython> {
    let all = cpythons();
    let mut out: Vec<Cpython> = all
        .iter()
        .rfind(|p| p.sid.is_none() && p.embedding().is_some())
        .cloned()
        .into_iter()
        .collect();
    out.extend(all.into_iter().filter(|p| p.sid.is_some()));
    out.retain(|p| {
        let ok = p.embedding().is_some();
        if !ok {
            crate::skip(format_args!(
                "embedding {}: no libpython{}.so.1.0",
                p.label, p.minor
            ));
        }
        ok
    });
    out
}

/// Runs `f` for every CPython of [`cpythons`], `parallel` at a time, and
/// returns the results in the list's order. A panic in one fails the test
/// with that interpreter's message.
pub fn for_each_cpython<T: Send + 'static>(
    parallel: usize,
    f: impl Fn(&Cpython) -> T + Send + Sync + 'static,
) -> Vec<(Cpython, T)> {
    for_each_of(cpythons(), parallel, f)
}

/// [`for_each_cpython`] over the interpreters `list`.
pub fn for_each_of<T: Send + 'static>(
    list: Vec<Cpython>,
    parallel: usize,
    f: impl Fn(&Cpython) -> T + Send + Sync + 'static,
) -> Vec<(Cpython, T)> {
    use std::sync::{Arc, Mutex};
    let work = Arc::new(Mutex::new(list.into_iter().enumerate().collect::<Vec<_>>()));
    let f = Arc::new(f);
    let results = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..parallel.max(1))
        .map(|_| {
            let (work, f, results) = (work.clone(), f.clone(), results.clone());
            std::thread::spawn(move || {
                loop {
                    let next = work.lock().unwrap().pop();
                    let Some((i, py)) = next else { break };
                    let r = f(&py);
                    results.lock().unwrap().push((i, py, r));
                }
            })
        })
        .collect();
    let mut failed = None;
    for w in workers {
        if let Err(e) = w.join() {
            failed = Some(e);
        }
    }
    if let Some(e) = failed {
        std::panic::resume_unwind(e);
    }
    let mut r = std::mem::take(&mut *results.lock().unwrap());
    r.sort_by_key(|(i, _, _)| *i);
    r.into_iter().map(|(_, py, t)| (py, t)).collect()
}
