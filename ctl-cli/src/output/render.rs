//! Human output: byte sizes, aligned tables, sparklines.

/// Bytes for a person: `512 B`, `3.2 KiB`, `48.0 MiB`, `1.25 GiB`.
pub fn bytes(b: u64) -> String {
    const K: f64 = 1024.0;
    if b < 1024 {
        return format!("{b} B");
    }
    let f = b as f64;
    // A unit serves while its figure, rounded to one decimal, stays below
    // 1024 of it: 1 GiB less a page is "1.00 GiB", not "1024.0 MiB".
    for (unit, div) in [("KiB", K), ("MiB", K * K)] {
        if f / div < 1023.95 {
            return format!("{:.1} {unit}", f / div);
        }
    }
    format!("{:.2} GiB", f / (K * K * K))
}

/// Bytes in MiB below a GiB, else in GiB, with one decimal: `512.0 MiB`,
/// `1.5 GiB`. `doctor`'s host lines write memory so; everything else uses
/// [`bytes`].
pub fn mib_or_gib(b: u64) -> String {
    let gib = b as f64 / (1u64 << 30) as f64;
    if gib >= 1.0 {
        format!("{gib:.1} GiB")
    } else {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

/// An optional byte figure; `-` when unknown.
pub fn opt_bytes(b: Option<u64>) -> String {
    b.map_or_else(|| "-".to_owned(), bytes)
}

/// A signed change in bytes: `+12.0 MiB`, `-1.0 GiB`, `±0 B`.
pub fn delta(from: u64, to: u64) -> String {
    match to.cmp(&from) {
        std::cmp::Ordering::Greater => format!("+{}", bytes(to - from)),
        std::cmp::Ordering::Less => format!("-{}", bytes(from - to)),
        std::cmp::Ordering::Equal => "±0 B".to_owned(),
    }
}

/// Milliseconds for a person.
pub fn ms(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.2} ms")
    } else {
        format!("{v:.0} ms")
    }
}

/// A table with a header; numeric-looking columns are right-aligned.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let n = header.len();
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate().take(n) {
            width[i] = width[i].max(c.chars().count());
        }
    }
    let right: Vec<bool> = (0..n)
        .map(|i| {
            rows.iter().all(|r| {
                r.get(i).is_none_or(|c| {
                    c.starts_with(|ch: char| {
                        ch.is_ascii_digit() || ch == '-' || ch == '+' || ch == '±'
                    })
                })
            }) && i + 1 < n
        })
        .collect();
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            let pad = width[i].saturating_sub(c.chars().count());
            if i > 0 {
                l.push_str("  ");
            }
            if right[i] {
                l.push_str(&" ".repeat(pad));
                l.push_str(c);
            } else {
                l.push_str(c);
                if i + 1 < cells.len() {
                    l.push_str(&" ".repeat(pad));
                }
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
    out
}

/// `label  value  note` lines with the values aligned.
pub fn kv(rows: &[(&str, String, &str)]) -> String {
    let lw = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let vw = rows.iter().map(|r| r.1.chars().count()).max().unwrap_or(0);
    let mut out = String::new();
    for (k, v, note) in rows {
        let l = format!("  {k:<lw$}  {v:>vw$}  {note}");
        out.push_str(l.trim_end());
        out.push('\n');
    }
    out
}

/// A sparkline of `values` scaled between their min and max.
pub fn sparkline(values: &[u64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let (Some(&lo), Some(&hi)) = (values.iter().min(), values.iter().max()) else {
        return String::new();
    };
    values
        .iter()
        .map(|&v| {
            if hi == lo {
                BARS[0]
            } else {
                BARS[((v - lo) as f64 / (hi - lo) as f64 * 7.0).round() as usize]
            }
        })
        .collect()
}

/// Shortens `s` to `n` characters with an ellipsis.
pub fn shorten(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        format!(
            "{}…",
            s.chars().take(n.saturating_sub(1)).collect::<String>()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_a_person_writes_them() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(48 << 20), "48.0 MiB");
        assert_eq!(bytes(5 << 29), "2.50 GiB");
        // Rounding never writes 1024 of a unit.
        assert_eq!(bytes((1 << 30) - 4096), "1.00 GiB");
        assert_eq!(bytes((1 << 20) - 1), "1.0 MiB");
        assert_eq!(bytes((1 << 20) - 60), "1023.9 KiB");
        assert_eq!(opt_bytes(None), "-");
        assert_eq!(mib_or_gib(512 << 20), "512.0 MiB");
        assert_eq!(mib_or_gib(4096), "0.0 MiB");
        assert_eq!(mib_or_gib(3 << 29), "1.5 GiB");
        assert_eq!(delta(3 << 20, 1 << 20), "-2.0 MiB");
        assert_eq!(delta(1, 1), "±0 B");
        assert_eq!(ms(0.25), "0.25 ms");
        assert_eq!(ms(41.7), "42 ms");
    }

    #[test]
    fn tables_align_numbers_right_and_text_left() {
        let t = table(
            &["PID", "RSS", "COMMAND"],
            &[
                vec!["7".into(), "1.0 MiB".into(), "a".into()],
                vec!["12345".into(), "300.0 MiB".into(), "python3 x".into()],
            ],
        );
        assert_eq!(
            t,
            "  PID        RSS  COMMAND\n    7    1.0 MiB  a\n12345  300.0 MiB  python3 x\n"
        );
    }

    #[test]
    fn sparkline_spans_min_to_max() {
        assert_eq!(sparkline(&[0, 7, 14]), "▁▅█");
        assert_eq!(sparkline(&[5, 5]), "▁▁");
        assert_eq!(sparkline(&[]), "");
        assert_eq!(shorten("abcdef", 4), "abc…");
    }

    #[test]
    fn kv_aligns_values() {
        assert_eq!(
            kv(&[("a", "1 B".into(), "x"), ("long", "10 B".into(), "")]),
            "  a      1 B  x\n  long  10 B\n"
        );
    }
}
