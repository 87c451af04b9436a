//! Why a shimmed process has no control endpoint, in words for a person,
//! with what to do: its `MEMSHIM_CONTROL`, a single thread, a socket
//! directory the shim refuses or cannot create, something else at the
//! socket's path, a main thread gone with `pthread_exit`, a shim thread
//! that is not running. `client.rs` says it when a connection fails; `list`,
//! `cgroup` and `doctor` show it for each such process.

use crate::reach::procfs::{self, Environ, Proc};
use crate::reach::socket::SocketLoc;
use memshim_proto::settings::{self, Control};
use std::path::Path;

/// Why a directory is one the shim refuses, if it is.
pub fn unsafe_dir(dir: &Path, uid: u32) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(dir).ok()?;
    if m.file_type().is_symlink() {
        return Some(format!(
            "{} is a symbolic link; the shim refuses it",
            dir.display()
        ));
    }
    if !m.is_dir() {
        return Some(format!("{} is not a directory", dir.display()));
    }
    if m.uid() != uid {
        return Some(format!(
            "{} is owned by uid {}, not by the process's uid {uid}; the shim refuses it",
            dir.display(),
            m.uid()
        ));
    }
    if m.mode() & 0o077 != 0 {
        return Some(format!(
            "{} has mode {:04o}; the shim refuses a directory group or others can use",
            dir.display(),
            m.mode() & 0o7777
        ));
    }
    None
}

/// Why the shim cannot create the socket directory `dir`: its parent does
/// not exist (the shim creates only the last component).
pub fn missing_parent(dir: &Path) -> Option<String> {
    let parent = dir.parent().filter(|d| !d.exists())?;
    Some(format!(
        "the socket directory {} cannot be created: its parent {} does not exist (the shim creates only the last \
         component)",
        dir.display(),
        parent.display()
    ))
}

/// Why the endpoint of a shimmed process is not there, for a person.
pub fn why(p: &Proc, loc: &SocketLoc) -> (String, String) {
    let control = procfs::control_mode(Environ::read(&p.view).as_ref());
    let name = settings::CONTROL.name;
    if control == Control::Off {
        return (
            format!("{name}=off: this process has no control endpoint"),
            format!("restart it without {name}=off"),
        );
    }
    if p.threads <= 1 && control != Control::On {
        return (
            format!(
                "single-threaded process: the endpoint starts with its second thread, or set {name}=on"
            ),
            format!("start the process with {name}=on to have the endpoint from the start"),
        );
    }
    if let Some(why) = unsafe_dir(&loc.dir, p.uid) {
        return (
            why,
            format!(
                "remove {} (the shim re-creates it safely within 5 s)",
                loc.dir.display()
            ),
        );
    }
    if p.main_thread_gone() {
        return (
            "its main thread has ended with pthread_exit: the shim's thread then stops for good, so that the \
             process's exit (atexit handlers, stdio's flush) runs on one of the program's own threads"
                .into(),
            "none: memory still goes back as the program allocates and frees (decay); `memshim-ctl list` and \
             `cgroup` still show the process"
                .into(),
        );
    }
    if p.threads <= 1 && procfs::shim_loaded(p.ppid).unwrap_or(false) {
        // MEMSHIM_CONTROL=on starts the thread in the constructor, so a
        // process alone under it, whose parent has the shim, did not run
        // the constructor: a fork child. (One whose parent has no shim is
        // most likely one where the shim does not interpose: below.)
        return (
            format!(
                "single-threaded although {name}=on starts the shim's thread at once: most likely the fork child of \
                 a shimmed process, which starts the thread and its socket with its own first pthread_create"
            ),
            "reach the parent, or let the child start a thread of its own; `memshim-ctl doctor` says more".into(),
        );
    }
    if !procfs::has_shim_thread(p.pid) {
        return (
            "the shim's thread is not running (it stops when the process has been single-threaded for a while, and \
             never runs where the shim does not interpose malloc)"
                .into(),
            format!(
                "`memshim-ctl doctor {}` tells whether the shim interposes (a program with its own malloc, a \
                 sanitizer){}",
                p.pid,
                if control == Control::On {
                    String::new()
                } else {
                    format!("; if it does, {name}=on keeps the thread")
                }
            ),
        );
    }
    if let Some(why) = missing_parent(&loc.dir) {
        let parent = loc.dir.parent().unwrap_or(Path::new("/"));
        return (
            why,
            format!(
                "create {} (the shim binds within 5 s), or point {} elsewhere",
                parent.display(),
                settings::SOCKET_DIR.name
            ),
        );
    }
    if let Some(blocked) = blocked_socket(&loc.path()) {
        return blocked;
    }
    // The thread runs: its socket is missing, or a file nobody listens on
    // (the thread is binding it again).
    let why = if std::fs::symlink_metadata(loc.path()).is_ok() {
        "the shim's thread runs and binds its socket again shortly".to_owned()
    } else {
        format!("no socket at {}", loc.path().display())
    };
    (
        why,
        format!(
            "the endpoint may be starting (retry in a few seconds); {}=1 shows why it failed",
            settings::VERBOSE.name
        ),
    )
}

/// What occupies a socket's path when it is not a socket (nor a symbolic
/// link, which the client refuses by itself): "a regular file", "a
/// directory", ... The shim never removes a file it did not make, so it
/// cannot bind there until someone does.
pub fn not_a_socket(path: &Path) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let t = std::fs::symlink_metadata(path).ok()?.file_type();
    Some(if t.is_socket() || t.is_symlink() {
        return None;
    } else if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else {
        "a device file"
    })
}

/// Why, and what to do, when something other than a socket occupies the
/// socket's path ([`not_a_socket`]).
pub fn blocked_socket(path: &Path) -> Option<(String, String)> {
    let kind = not_a_socket(path)?;
    Some((
        format!(
            "{} is {kind}, not a socket: the shim never removes a file it did not make, so it cannot bind its \
             socket there",
            path.display()
        ),
        format!(
            "remove it (`rm {}`); the shim then binds its socket within a few seconds",
            shell_quoted(&path.display().to_string())
        ),
    ))
}

/// `s` as one shell word: as it is where it has only characters no shell
/// treats specially, else in single quotes (a path another user chose goes
/// into a command we suggest).
pub fn shell_quoted(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+:@%,=".contains(&b))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggested_commands_quote_what_a_shell_would_split() {
        assert_eq!(
            shell_quoted("/tmp/memshim-0/1-2-3.sock"),
            "/tmp/memshim-0/1-2-3.sock"
        );
        assert_eq!(shell_quoted("/tmp/a b"), "'/tmp/a b'");
        assert_eq!(shell_quoted("/tmp/it's"), "'/tmp/it'\\''s'");
        assert_eq!(shell_quoted(""), "''");
    }
}
