//! What differs between the CPython versions the bridge serves, in one
//! table ([`ROWS`]), and the versions and builds it refuses.
//!
//! Everything else the bridge does is the same on every version it serves:
//! the C API it calls exists with the same signature in 3.8 to 3.15
//! (`ffi.rs`; a function that only some versions have is optional there and
//! named in its comment). What changes between versions is how CPython
//! treats a thread that asks for the GIL once finalization has begun, and
//! with it how the bridge keeps its job thread out of a finalizing
//! interpreter (docs/python.md, "Shutdown").
//!
//! A version outside the table (3.7 and older, 3.16 and newer) and a
//! free-threaded build of any version are refused with
//! `python_unavailable: unsupported`, naming the version and the build,
//! before anything of CPython's is called but `Py_GetVersion`.

use memshim_proto::PythonUnavailable;

/// What CPython does with a thread that asks for the GIL
/// (`PyEval_RestoreThread`) once the runtime is finalizing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LateAttach {
    /// Ends it with `pthread_exit` (3.8 to 3.13.7). The forced unwind needs
    /// glibc's `libgcc_s.so.1`, which the shim's thread loads beforehand.
    Exits,
    /// Blocks it for ever (3.13.8 and later 3.13 releases, 3.14: CPython
    /// gh-87135 and its backport): it must never be started late, and never
    /// be waited for.
    Parks,
    /// Never happens to the bridge: it attaches under a PEP 788 interpreter
    /// guard (3.15), which cannot be had once finalization has begun and,
    /// while held, keeps finalization from beginning.
    Guarded,
}

/// One row of the table: the versions from `(minor, from_patch)` up to the
/// next row's start.
struct Row {
    minor: u32,
    from_patch: u32,
    late_attach: LateAttach,
}

/// The versions the bridge serves (all 3.x), in order. A minor version
/// that no row names is not served.
#[rustfmt::skip]
const ROWS: [Row; 9] = [
    Row { minor: 8, from_patch: 0, late_attach: LateAttach::Exits },
    Row { minor: 9, from_patch: 0, late_attach: LateAttach::Exits },
    Row { minor: 10, from_patch: 0, late_attach: LateAttach::Exits },
    Row { minor: 11, from_patch: 0, late_attach: LateAttach::Exits },
    Row { minor: 12, from_patch: 0, late_attach: LateAttach::Exits },
    Row { minor: 13, from_patch: 0, late_attach: LateAttach::Exits },
    Row { minor: 13, from_patch: 8, late_attach: LateAttach::Parks },
    Row { minor: 14, from_patch: 0, late_attach: LateAttach::Parks },
    Row { minor: 15, from_patch: 0, late_attach: LateAttach::Guarded },
    // Keep `memshim_proto::PYTHON_SERVED` in step (a unit test checks it).
];

/// A served interpreter: what the bridge needs to know about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Profile {
    /// See [`LateAttach`].
    pub late_attach: LateAttach,
}

/// `major.minor.patch` of a version string such as "3.13.18",
/// "3.13.0rc1" or "3.15.0a2+" (a pre-release counts as patch 0).
pub fn parse(v: &str) -> Option<(u32, u32, u32)> {
    let mut it = v.split('.');
    let major = it.next()?.parse().ok()?;
    let minor = leading_number(it.next()?)?;
    let patch = it.next().and_then(leading_number).unwrap_or(0);
    Some((major, minor, patch))
}

fn leading_number(s: &str) -> Option<u32> {
    let digits: String = s.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// Whether `Py_GetVersion()`'s whole text names a free-threaded build
/// ("3.13.1 experimental free-threading build (main, ...)", 3.14's
/// "3.14.0 free-threading build (...)").
pub fn text_says_free_threaded(full_version: &str) -> bool {
    full_version.contains("free-threading")
}

/// The profile of a served interpreter, or why it is not served.
/// `version` is `Py_GetVersion()` up to its first space; `free_threaded`
/// whether the build has no GIL.
pub fn profile(version: &str, free_threaded: bool) -> Result<Profile, PythonUnavailable> {
    let unsupported = |build: Option<&str>| PythonUnavailable::Unsupported {
        version: version.to_owned(),
        build: build.map(str::to_owned),
    };
    if free_threaded {
        // CPython's finalization does not force a free-threaded build's
        // waiting threads out (gh-124149), and the bridge's thread-state
        // handling assumes a GIL: refused by build, whatever the version.
        return Err(unsupported(Some(memshim_proto::FREE_THREADED_BUILD)));
    }
    let Some((3, minor, patch)) = parse(version) else {
        return Err(unsupported(None));
    };
    ROWS.iter()
        .rev()
        .find(|r| r.minor == minor && patch >= r.from_patch)
        .map(|r| Profile {
            late_attach: r.late_attach,
        })
        .ok_or_else(|| unsupported(None))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn late(v: &str) -> Option<LateAttach> {
        profile(v, false).ok().map(|p| p.late_attach)
    }

    #[test]
    fn parses_versions() {
        assert_eq!(parse("3.11.7"), Some((3, 11, 7)));
        assert_eq!(parse("3.13.0rc1"), Some((3, 13, 0)));
        assert_eq!(parse("3.13.18"), Some((3, 13, 18)));
        assert_eq!(parse("3.15.0a2+"), Some((3, 15, 0)));
        assert_eq!(parse("3.14"), Some((3, 14, 0)));
        assert_eq!(parse("x"), None);
        assert_eq!(parse("3"), None);
    }

    #[test]
    fn the_table_says_how_each_version_treats_a_late_attach() {
        assert_eq!(late("3.8.18"), Some(LateAttach::Exits));
        assert_eq!(late("3.12.1"), Some(LateAttach::Exits));
        assert_eq!(late("3.13.0"), Some(LateAttach::Exits));
        assert_eq!(late("3.13.7"), Some(LateAttach::Exits));
        assert_eq!(late("3.13.8"), Some(LateAttach::Parks));
        assert_eq!(late("3.13.18"), Some(LateAttach::Parks));
        assert_eq!(late("3.14.10"), Some(LateAttach::Parks));
        assert_eq!(late("3.15.2"), Some(LateAttach::Guarded));
    }

    #[test]
    fn unknown_versions_and_free_threaded_builds_are_refused_by_name() {
        for v in ["2.7.18", "3.6.15", "3.7.16", "3.16.0", "4.0.0", "junk"] {
            assert_eq!(
                profile(v, false),
                Err(PythonUnavailable::Unsupported {
                    version: v.into(),
                    build: None
                }),
                "{v}"
            );
        }
        assert_eq!(
            profile("3.13.1", true),
            Err(PythonUnavailable::Unsupported {
                version: "3.13.1".into(),
                build: Some("free-threading".into())
            })
        );
        assert!(text_says_free_threaded(
            "3.13.1 experimental free-threading build (main, Dec  4 2024) [GCC 12]"
        ));
        assert!(text_says_free_threaded(
            "3.14.0 free-threading build (main) [Clang]"
        ));
        assert!(!text_says_free_threaded(
            "3.14.10 (main, Oct 26 2026, 15:12:11) [GCC 16.2.0]"
        ));
    }

    #[test]
    fn the_table_and_the_protocols_served_range_agree() {
        let (lo, hi) = memshim_proto::PYTHON_SERVED;
        assert_eq!((3, ROWS[0].minor), lo);
        assert_eq!((3, ROWS[ROWS.len() - 1].minor), hi);
        assert!(
            ROWS.windows(2)
                .all(|w| (w[0].minor, w[0].from_patch) <= (w[1].minor, w[1].from_patch))
        );
    }
}
