//! What the CLI writes and how it looks: stdout, stderr and safe text
//! (print.rs), sizes, tables and sparklines (render.rs), and the timeline
//! chart of `record` and `watch` (timeline.rs); [`check_file`] for a file
//! given with `-o`. stdout itself comes from closed.rs, which knows whether
//! it was closed before the CLI started.

pub mod closed;
pub mod print;
pub mod render;
pub mod timeline;

use std::path::Path;

/// Whether `path` can be written, found out before a command spends its
/// time (`profile`'s sampling, `record`'s recording) and without changing
/// it: an existing file is opened to append and left as it is, a new one is
/// created and removed again (never one that appeared meanwhile). A FIFO,
/// a terminal or another device is left alone: opening a FIFO waits for its
/// reader and would then hand it an end of file.
pub fn check_file(path: &Path) -> std::io::Result<()> {
    use std::fs::OpenOptions;
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() || m.is_dir() => OpenOptions::new().append(true).open(path).map(drop),
        // A device, or a link to nothing yet (written through at the end).
        Ok(_) => Ok(()),
        Err(_) if std::fs::symlink_metadata(path).is_ok() => Ok(()),
        Err(_) => {
            OpenOptions::new().write(true).create_new(true).open(path)?;
            let _ = std::fs::remove_file(path);
            Ok(())
        }
    }
}
