//! The environment, read without calling libc.
//!
//! The configuration is read inside jemalloc's initialisation (see
//! `raw.rs` for why no interposable libc call may run there), so variables
//! are looked up by walking `environ` directly. Like `secure_getenv`, the
//! lookup answers nothing in secure-execution mode (setuid programs).

use core::ffi::{CStr, c_char};

unsafe extern "C" {
    static environ: *const *const c_char;
}

/// Secure-execution mode (`AT_SECURE`): the environment is not trusted.
fn secure() -> bool {
    // SAFETY: getauxval reads the aux vector; it neither allocates nor fails.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// The `NAME=value` entries whose first byte `first` accepts, as bytes.
/// The others are skipped without measuring their length: this runs in
/// every exec, and of an environment's few dozen entries only those
/// starting with `M` can be a setting (issue 48, item 1: matching every
/// entry against every name took 450 `memcmp` and 80 `strlen` calls, 12 k
/// instructions, in every `/bin/true`). Allocation-free.
#[unsafe(link_section = ".text.startup")]
pub fn entries_starting(first: impl Fn(u8) -> bool) -> impl Iterator<Item = &'static [u8]> {
    // SAFETY: `environ` is NULL or a NULL-terminated array of C strings that
    // live as long as the process unless the program edits its environment
    // (then we read the array it put there).
    let mut p = unsafe { environ };
    core::iter::from_fn(move || {
        // SAFETY: as above; `p` stays inside the array up to its NULL, and
        // each entry has at least its NUL to read.
        unsafe {
            loop {
                if p.is_null() || (*p).is_null() {
                    return None;
                }
                let e = *p;
                p = p.add(1);
                if first(*e as u8) {
                    return Some(CStr::from_ptr(e).to_bytes());
                }
            }
        }
    })
}

/// The values of `names` (`None` for each one unset), in one walk of the
/// environment; the first entry of a name wins, as with `getenv`. All
/// `None` in secure-execution mode. Allocation-free.
#[unsafe(link_section = ".text.startup")]
pub fn vars<const N: usize>(names: &[&[u8]; N]) -> [Option<&'static [u8]>; N] {
    let mut found = [None; N];
    if secure() {
        return found;
    }
    let starts = |b: u8| names.iter().any(|n| n.first() == Some(&b));
    for e in entries_starting(starts) {
        for (slot, name) in found.iter_mut().zip(names) {
            if slot.is_none()
                && let Some(v) = e.strip_prefix(*name).and_then(|r| r.strip_prefix(b"="))
            {
                *slot = Some(v);
                break;
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    fn std_var(name: &str) -> Option<Vec<u8>> {
        std::env::var(name).ok().map(String::into_bytes)
    }

    #[test]
    fn reads_variables_without_libc() {
        let [path, unset] = super::vars(&[b"PATH".as_slice(), b"MEMSHIM_SURELY_UNSET_VARIABLE"]);
        assert_eq!(path.map(<[u8]>::to_vec), std_var("PATH"));
        assert_eq!(unset, None);
    }

    #[test]
    fn reads_several_variables_in_one_walk() {
        let [path, home, unset, path_prefix] = super::vars(&[
            b"PATH".as_slice(),
            b"HOME",
            b"MEMSHIM_SURELY_UNSET_VARIABLE",
            b"PAT",
        ]);
        assert_eq!(path.map(<[u8]>::to_vec), std_var("PATH"));
        assert_eq!(home.map(<[u8]>::to_vec), std_var("HOME"));
        assert_eq!(unset, None);
        assert_eq!(path_prefix, None, "a prefix of a name is not the name");
    }
}
