//! `profile --python`: tracemalloc's live memory by line of Python code,
//! shown as a table (with each line's source) or JSON, and the growth
//! between two snapshots (docs/profile.md, "Python lines").

use crate::output::render::{bytes, table};
use crate::profile::heap::signed_bytes;
use crate::reach::untrusted::{self, Links};
use memshim_proto::{PyLine, PySnapshot, PyTraceReply};
use serde::Serialize;
use std::collections::HashMap;

/// One line's figures (negative in a growth view: freed).
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Row {
    /// The file, as the process names it.
    pub file: String,
    /// The line number.
    pub line: u32,
    /// Live bytes.
    pub bytes: i64,
    /// Live allocations.
    pub count: i64,
}

fn rows(s: &PySnapshot) -> Vec<Row> {
    s.lines.iter().map(row).collect()
}

fn row(l: &PyLine) -> Row {
    Row {
        file: l.file.clone(),
        line: l.line,
        bytes: l.bytes as i64,
        count: l.count as i64,
    }
}

/// What grew between two snapshots, line by line, largest change first.
/// Lines beyond either snapshot's top are not compared.
pub fn growth(old: &PySnapshot, new: &PySnapshot) -> Vec<Row> {
    let mut m: HashMap<(String, u32), (i64, i64)> = HashMap::new();
    for (s, sign) in [(new, 1), (old, -1)] {
        for l in &s.lines {
            let e = m.entry((l.file.clone(), l.line)).or_default();
            e.0 += sign * l.bytes as i64;
            e.1 += sign * l.count as i64;
        }
    }
    let mut v: Vec<Row> = m
        .into_iter()
        .filter(|(_, (b, c))| *b != 0 || *c != 0)
        .map(|((file, line), (bytes, count))| Row {
            file,
            line,
            bytes,
            count,
        })
        .collect();
    v.sort_by(|a, b| {
        b.bytes
            .abs()
            .cmp(&a.bytes.abs())
            .then_with(|| (&a.file, a.line).cmp(&(&b.file, b.line)))
    });
    v
}

/// The largest source file whose line is shown.
const SOURCE_LIMIT: u64 = 16 << 20;

/// The source text of `file:line` as process `pid` sees it, trimmed.
fn source(pid: i32, file: &str, line: u32) -> Option<String> {
    if !file.starts_with('/') || line == 0 {
        return None;
    }
    let read = |p: &str| untrusted::read_regular_text(p.as_ref(), Links::Follow, SOURCE_LIMIT);
    let text = read(&format!("/proc/{pid}/root{file}"))
        .or_else(|_| read(file))
        .ok()?;
    let l = text.lines().nth(line as usize - 1)?.trim();
    Some(crate::output::render::shorten(l, 60))
}

/// The table of `rows` (at most `top`), each with its source line.
pub fn table_of(pid: i32, rows: &[Row], total: i64, top: usize) -> String {
    let total = total.unsigned_abs().max(1) as f64;
    let body: Vec<Vec<String>> = rows
        .iter()
        .take(top)
        .map(|r| {
            vec![
                signed_bytes(r.bytes),
                format!("{:.1}%", r.bytes as f64 * 100.0 / total),
                r.count.to_string(),
                format!("{}:{}", r.file, r.line),
                source(pid, &r.file, r.line).unwrap_or_default(),
            ]
        })
        .collect();
    if body.is_empty() {
        return "no live traced allocations\n".into();
    }
    table(&["LIVE", "SHARE", "COUNT", "LINE", "CODE"], &body)
}

/// The whole report of one snapshot.
pub fn report(pid: i32, r: &PyTraceReply, top: usize) -> String {
    let Some(s) = &r.snapshot else {
        return "tracemalloc is not tracing\n".into();
    };
    let mut out = format!(
        "pid {pid}: {} live in {} Python allocations on {} lines (tracemalloc, {} frame{}; snapshot {:.0} ms with the GIL)\n\n",
        bytes(s.bytes),
        s.count,
        s.distinct_lines,
        r.frames,
        if r.frames == 1 { "" } else { "s" },
        s.elapsed_ms
    );
    out.push_str(&table_of(pid, &rows(s), s.bytes as i64, top));
    out.push_str(&footer(r));
    out
}

/// What tracemalloc cannot see, and what it costs.
pub fn footer(r: &PyTraceReply) -> String {
    format!(
        "\ntracemalloc sees what Python's allocators hand out (objects, and buffers such as numpy's, which report to it), \
not torch's tensors or other C extensions' malloc: the native profile (without --python) sees those.\n\
tracemalloc's own memory: {}; traced now {} (peak {}){}.\n",
        bytes(r.overhead_bytes),
        bytes(r.traced_bytes),
        bytes(r.peak_bytes),
        if r.ours {
            "; memshim started it"
        } else {
            "; the program traces by itself (left on)"
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(file: &str, line: u32, bytes: u64) -> PyLine {
        PyLine {
            file: file.into(),
            line,
            bytes,
            count: 1,
        }
    }

    #[test]
    fn growth_is_new_minus_old_by_line() {
        let old = PySnapshot {
            lines: vec![line("/a.py", 3, 100), line("/a.py", 9, 50)],
            ..Default::default()
        };
        let new = PySnapshot {
            lines: vec![
                line("/a.py", 3, 100),
                line("/a.py", 9, 10),
                line("/b.py", 1, 70),
            ],
            ..Default::default()
        };
        let g = growth(&old, &new);
        assert_eq!(g.len(), 2, "{g:?}");
        assert_eq!((g[0].file.as_str(), g[0].bytes), ("/b.py", 70));
        assert_eq!((g[1].line, g[1].bytes), (9, -40));
    }
}
