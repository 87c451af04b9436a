//! `/proc/<pid>/stat`, the kernel's text: pure functions on its bytes, for
//! the shim (which calls them in fixed buffers: they allocate nothing),
//! memshim-ctl and the tests, so that all three read a process's start
//! time (with its pid, what tells a reused pid from the process that
//! created a socket) the same way.

use crate::settings::parse_u64;

/// The fields of a `stat` line from field 3 (the state) on: those after
/// the last `)`, since the command (field 2) may hold spaces and `)`.
pub fn stat_fields(stat: &[u8]) -> Option<impl Iterator<Item = &[u8]>> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    Some(
        stat[close + 1..]
            .split(u8::is_ascii_whitespace)
            .filter(|f| !f.is_empty()),
    )
}

/// The state letter of a `stat` line (field 3: `R`, `S`, `Z`, ...).
pub fn stat_state(stat: &[u8]) -> Option<u8> {
    stat_fields(stat)?.next()?.first().copied()
}

/// The `flags` of a `stat` line (field 9, `PF_*`).
pub fn stat_flags(stat: &[u8]) -> Option<u64> {
    parse_u64(stat_fields(stat)?.nth(6)?)
}

/// The start time of a `stat` line (field 22), in clock ticks after boot.
pub fn stat_starttime(stat: &[u8]) -> Option<u64> {
    parse_u64(stat_fields(stat)?.nth(19)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_come_after_the_last_parenthesis_of_the_command() {
        let stat =
            b"42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987654 1000 10\n";
        assert_eq!(stat_state(stat), Some(b'S'));
        assert_eq!(stat_flags(stat), Some(4194560));
        assert_eq!(stat_starttime(stat), Some(987654));
        for bad in [&b"garbage"[..], b"", b"1 (x) S 1", b"1 (x) S 1 2 3 4 5 -6"] {
            assert_eq!(stat_starttime(bad), None, "{bad:?}");
        }
        assert_eq!(stat_flags(b"1 (x) S 1 2 3 4 5 -6"), None);
    }
}
