//! `memshim-ctl run [OPTIONS] -- CMD ARGS...`: run a command with the shim
//! preloaded. Finds libmemshim.so, prepends it to `LD_PRELOAD`, turns the
//! options into `MEMSHIM_*` variables and `exec`s the command, so CMD's
//! arguments, stdio, pid and exit status are its own.

use crate::output::print::errln;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use memshim_proto::endpoint::MAX_NARENAS;
use memshim_proto::settings::{self, Control};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::exit::{self, Exit, Failure};

/// Options of `memshim-ctl run`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  memshim-ctl run -- python app.py --port 8000\n  \
    memshim-ctl run --dirty-ms 500 -- gunicorn app:app\n\n\
    The library is MEMSHIM_LIB if set, else ../lib/libmemshim.so beside the real path of \
    memshim-ctl (an installed tree), else libmemshim.so in the same directory (a build tree)."
)]
pub struct RunArgs {
    /// MEMSHIM_DIRTY_DECAY_MS: ms until freed pages go back to the OS (-1 = never)
    #[arg(long, value_name = "MS", allow_negative_numbers = true, value_parser = crate::args::decay_ms)]
    pub dirty_ms: Option<i64>,
    /// MEMSHIM_MUZZY_DECAY_MS: ms MADV_FREE'd pages are kept (-1 = never)
    #[arg(long, value_name = "MS", allow_negative_numbers = true, value_parser = crate::args::decay_ms)]
    pub muzzy_ms: Option<i64>,
    /// MEMSHIM_NARENAS: arena count, or auto
    #[arg(long, value_name = "N|auto", value_parser = narenas)]
    pub narenas: Option<String>,
    /// MEMSHIM_CONTROL: when the shim's thread and control socket start
    #[arg(long, value_name = "MODE", value_parser = ControlParser::new())]
    pub control: Option<String>,
    /// MEMSHIM_VERBOSE=1: the shim prints its effective settings at start-up
    #[arg(long)]
    pub verbose: bool,
    /// Print the library and environment chosen (on stderr), and run nothing
    #[arg(long)]
    pub dry_run: bool,
    /// The command and its arguments (after `--`), passed on untouched
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<OsString>,
}

/// `--narenas`: what the shim accepts in `MEMSHIM_NARENAS`
/// (`settings::parse_narenas`), passed on as written.
fn narenas(s: &str) -> Result<String, String> {
    settings::parse_narenas(s.as_bytes())
        .map(|_| s.to_owned())
        .ok_or_else(|| format!("{s:?} is not auto or a count from 1 to {MAX_NARENAS}"))
}

/// `--control`: what the shim accepts in `MEMSHIM_CONTROL`
/// (`settings::parse_control`: `auto`, and `on`, `off` in any of the
/// library's boolean spellings and any case), passed on as written.
/// `--help` and the error for another value list the documented words, as
/// clap's list of possible values would.
#[derive(Clone)]
struct ControlParser(PossibleValuesParser);

impl ControlParser {
    fn new() -> ControlParser {
        ControlParser(PossibleValuesParser::new(
            [Control::Auto, Control::On, Control::Off].map(Control::word),
        ))
    }
}

impl TypedValueParser for ControlParser {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<String, clap::Error> {
        match value.to_str() {
            Some(v) if settings::parse_control(v.as_bytes()).is_some() => Ok(v.to_owned()),
            _ => self.0.parse_ref(cmd, arg, value),
        }
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        self.0.possible_values()
    }
}

/// Where libmemshim.so is, and how it was found (for messages).
#[derive(Debug, PartialEq, Eq)]
pub struct Located {
    /// Absolute path of the library.
    pub path: PathBuf,
    /// How it was found.
    pub how: &'static str,
}

/// Finds libmemshim.so: `MEMSHIM_LIB`, else beside the real path of this
/// executable (`../lib/` of an installed tree, or the same directory of a
/// `target/release` build tree). The error lists every place looked at.
/// `lib`, if `LD_PRELOAD` can name it: ld.so splits that variable at
/// spaces, tabs, newlines and colons, so a path with one of them would be
/// preloaded as pieces that are not files, and the command would run
/// without the shim (and with two "cannot be preloaded" lines on stderr).
fn preloadable(lib: Located) -> Result<Located, String> {
    let bytes = lib.path.as_os_str().as_encoded_bytes();
    if bytes
        .iter()
        .any(|b| matches!(b, b' ' | b'\t' | b'\n' | b':'))
    {
        return Err(format!(
            "{} cannot be preloaded: LD_PRELOAD splits paths at spaces and colons; install the library, or \
             link it, at a path without them and point MEMSHIM_LIB there",
            lib.path.display()
        ));
    }
    Ok(lib)
}

pub fn locate_library(env_lib: Option<&OsStr>, exe: Option<&Path>) -> Result<Located, String> {
    if let Some(p) = env_lib.filter(|p| !p.is_empty()) {
        let p = Path::new(p);
        return match std::fs::canonicalize(p) {
            Ok(abs) if abs.is_file() && shared_object(&abs) => Ok(Located {
                path: abs,
                how: settings::LIB.name,
            }),
            Ok(abs) if abs.is_file() => Err(format!(
                "{}={} is not a shared library for this machine (not an ELF shared \
                 object of memshim-ctl's class and architecture); point it at libmemshim.so",
                settings::LIB.name,
                p.display()
            )),
            _ => Err(format!(
                "{}={} does not name a file; unset it or point it at libmemshim.so",
                settings::LIB.name,
                p.display()
            )),
        };
    }
    let Some(exe) = exe else {
        return Err(
            "cannot tell where memshim-ctl is installed; set MEMSHIM_LIB=/path/to/libmemshim.so"
                .into(),
        );
    };
    let real = std::fs::canonicalize(exe).unwrap_or_else(|_| exe.to_path_buf());
    let dir = real.parent().unwrap_or(Path::new("/"));
    let candidates = [
        (
            dir.join("../lib/libmemshim.so"),
            "installed beside memshim-ctl (../lib)",
        ),
        (dir.join("libmemshim.so"), "build tree beside memshim-ctl"),
    ];
    for (c, how) in &candidates {
        if let Ok(abs) = std::fs::canonicalize(c)
            && abs.is_file()
        {
            return Ok(Located { path: abs, how });
        }
    }
    Err(format!(
        "libmemshim.so not found: looked at {} and {}; reinstall with `make install`, or set MEMSHIM_LIB=/path/to/libmemshim.so",
        candidates[0].0.display(),
        candidates[1].0.display()
    ))
}

/// Whether `path` is an ELF shared library that ld.so can preload into
/// programs like this one: `ET_DYN` but not a position-independent
/// executable, of memshim-ctl's own class and machine (a wheel carries
/// both for one platform). Anything else ld.so skips with a message of its
/// own, and the command would run without the shim.
fn shared_object(path: &Path) -> bool {
    const BITS: u8 = if cfg!(target_pointer_width = "64") {
        64
    } else {
        32
    };
    const MACHINE: u16 = if cfg!(target_arch = "x86_64") {
        62
    } else if cfg!(target_arch = "aarch64") {
        183
    } else {
        0 // not checked
    };
    crate::elf::inspect(path)
        .is_ok_and(|e| e.shared_library && e.bits == BITS && (MACHINE == 0 || e.machine == MACHINE))
}

/// `LD_PRELOAD` with `lib` first, keeping every existing entry (ld.so
/// separates entries by spaces or colons) and not repeating `lib`.
pub fn prepend_preload(lib: &Path, existing: Option<&OsStr>) -> OsString {
    let mut out = OsString::from(lib);
    if let Some(old) = existing {
        for entry in old
            .as_bytes()
            .split(|b| *b == b' ' || *b == b':')
            .filter(|e| !e.is_empty())
        {
            if entry == lib.as_os_str().as_bytes() {
                continue;
            }
            out.push(":");
            out.push(OsStr::from_bytes(entry));
        }
    }
    out
}

/// The `MEMSHIM_*` variables the options ask for, in a stable order.
pub fn shim_env(a: &RunArgs) -> Vec<(&'static str, String)> {
    let mut v = vec![];
    if let Some(ms) = a.dirty_ms {
        v.push((settings::DIRTY_DECAY_MS.name, ms.to_string()));
    }
    if let Some(ms) = a.muzzy_ms {
        v.push((settings::MUZZY_DECAY_MS.name, ms.to_string()));
    }
    if let Some(n) = &a.narenas {
        v.push((settings::NARENAS.name, n.clone()));
    }
    if let Some(c) = &a.control {
        v.push((settings::CONTROL.name, c.clone()));
    }
    if a.verbose {
        v.push((settings::VERBOSE.name, "1".into()));
    }
    v
}

/// Runs the command in place of this process. Returns only with a failure
/// to find the library; if the command itself cannot be executed, exits with
/// 127 (not found) or 126 (not executable), as a shell does.
pub fn run(a: RunArgs) -> Result<Exit, Failure> {
    let exe = std::env::current_exe().ok();
    let lib = locate_library(
        std::env::var_os(settings::LIB.name).as_deref(),
        exe.as_deref(),
    )
    .and_then(preloadable)
    .map_err(|e| Failure::new(exit::NOT_FOUND, None, e).hint("nothing was run"))?;
    let preload = prepend_preload(&lib.path, std::env::var_os("LD_PRELOAD").as_deref());
    let vars = shim_env(&a);
    let (prog, args) = a.command.split_first().expect("clap requires CMD");
    if a.dry_run {
        errln!(
            "memshim-ctl: run: library {} ({})",
            lib.path.display(),
            lib.how
        );
        errln!("memshim-ctl: run: LD_PRELOAD={}", preload.to_string_lossy());
        for (k, v) in &vars {
            errln!("memshim-ctl: run: {k}={v}");
        }
        errln!(
            "memshim-ctl: run: dry run: {} not run",
            prog.to_string_lossy()
        );
        return Ok(exit::OK);
    }
    let mut cmd = Command::new(prog);
    cmd.args(args).env("LD_PRELOAD", &preload);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let err = cmd.exec();
    errln!(
        "memshim-ctl: error: cannot execute {}: {err}",
        prog.to_string_lossy()
    );
    std::process::exit(if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preload_is_prepended_once_keeping_other_entries() {
        let lib = Path::new("/opt/m/lib/libmemshim.so");
        assert_eq!(prepend_preload(lib, None), "/opt/m/lib/libmemshim.so");
        assert_eq!(
            prepend_preload(lib, Some(OsStr::new(""))),
            "/opt/m/lib/libmemshim.so"
        );
        assert_eq!(
            prepend_preload(
                lib,
                Some(OsStr::new("/a.so /opt/m/lib/libmemshim.so:/b.so"))
            ),
            "/opt/m/lib/libmemshim.so:/a.so:/b.so"
        );
    }

    #[test]
    fn option_values_are_what_the_shim_accepts() {
        assert!(narenas("auto").is_ok() && narenas("8").is_ok());
        assert!(narenas("0").is_err() && narenas("4095").is_err() && narenas("x").is_err());
        assert!(narenas("4094").is_ok() && narenas("+8").is_ok() && narenas("AUTO").is_ok());
        assert_eq!(
            narenas("0").unwrap_err(),
            "\"0\" is not auto or a count from 1 to 4094"
        );
        let cmd = clap::Command::new("run");
        let control = |v: &str| ControlParser::new().parse_ref(&cmd, None, OsStr::new(v));
        for ok in [
            "auto", "on", "off", "ON", "Auto", "1", "0", "yes", "no", "true", "false",
        ] {
            assert_eq!(control(ok).ok().as_deref(), Some(ok), "{ok:?}");
        }
        for bad in ["sometimes", "", "o n"] {
            let e = control(bad).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::InvalidValue, "{bad:?}");
        }
        let words: Vec<String> = ControlParser::new()
            .possible_values()
            .unwrap()
            .map(|v| v.get_name().to_owned())
            .collect();
        assert_eq!(words, ["auto", "on", "off"]);
    }

    #[test]
    fn missing_library_error_names_the_places_looked_at_and_the_fix() {
        let dir = std::env::temp_dir().join(format!("memshim-run-unit-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        let exe = dir.join("bin/memshim-ctl");
        std::fs::write(&exe, b"").unwrap();
        let e = locate_library(None, Some(&exe)).unwrap_err();
        assert!(
            e.contains("lib/libmemshim.so") && e.contains("MEMSHIM_LIB"),
            "{e}"
        );
        std::fs::create_dir_all(dir.join("lib")).unwrap();
        std::fs::write(dir.join("lib/libmemshim.so"), b"").unwrap();
        let l = locate_library(None, Some(&exe)).unwrap();
        assert_eq!(
            l.path,
            std::fs::canonicalize(dir.join("lib/libmemshim.so")).unwrap()
        );
        let e = locate_library(Some(OsStr::new("/nonexistent/x.so")), Some(&exe)).unwrap_err();
        assert!(e.starts_with("MEMSHIM_LIB="), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A loaded shared library passes; a position-independent executable
    /// (memshim-ctl itself), which ld.so will not preload, does not.
    #[test]
    fn a_pie_executable_is_not_a_shared_object() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let libc = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.contains("/libc.so.6"))
            .expect("libc in our maps");
        assert!(shared_object(Path::new(libc)), "{libc}");
        let exe = std::fs::canonicalize("/proc/self/exe").unwrap();
        assert!(!shared_object(&exe), "{}", exe.display());
        assert!(!shared_object(Path::new("/proc/self/status")));
    }
}
