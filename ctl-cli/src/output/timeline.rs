//! A memory timeline as a standalone SVG or HTML page: one line per
//! series (bytes over seconds), dashed markers where something happened.
//! `record` fills it; nothing here reads a process.

use crate::output::render::bytes;
use std::fmt::Write;

/// One line of the chart: a name, and a value per sample (`None` where the
/// sample lacks it: Python not loaded yet, a device not used yet).
pub struct Series {
    /// Legend text.
    pub name: String,
    /// One per sample of [`Timeline::t`].
    pub values: Vec<Option<u64>>,
}

/// Something that happened between two samples, drawn at the later one.
pub struct Marker {
    /// Seconds since the start.
    pub t: f64,
    /// Short label: `purge`, `pressure`, `vram return`.
    pub label: String,
}

/// What `record` gathered.
pub struct Timeline {
    /// Title line: pid, command, when.
    pub title: String,
    /// Seconds since the start, per sample.
    pub t: Vec<f64>,
    /// The lines.
    pub series: Vec<Series>,
    /// The events.
    pub markers: Vec<Marker>,
    /// Lines under the chart (how it was recorded, what is missing).
    pub notes: Vec<String>,
}

const W: f64 = 960.0;
const H: f64 = 420.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
/// Line colours, in series order (then again).
const COLOURS: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];
const MARKER_COLOURS: [(&str, &str); 3] = [
    ("purge", "#2ca02c"),
    ("pressure", "#d62728"),
    ("vram", "#9467bd"),
];

/// `&`, `<`, `>`, `"` escaped for XML text and attributes.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// A round step for about `n` ticks over `0..=max`.
fn tick_step(max: f64, n: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let raw = max / n;
    let mag = 10f64.powf(raw.log10().floor());
    let unit = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .find(|m| m * mag >= raw)
        .unwrap_or(10.0);
    unit * mag
}

/// A byte scale's step: whole MiB or GiB steps of 1, 2, 5 times a power of
/// two-ish round number, as [`tick_step`] gives in MiB.
fn byte_ticks(max: u64) -> Vec<u64> {
    let mib = (max as f64 / 1048576.0).max(1.0);
    let step = tick_step(mib, 5.0);
    let mut out = Vec::new();
    let mut v = 0.0;
    while v <= mib * 1.0001 + step {
        out.push((v * 1048576.0) as u64);
        v += step;
        if out.len() > 12 {
            break;
        }
    }
    out
}

impl Timeline {
    /// The chart alone, a complete SVG document.
    pub fn svg(&self) -> String {
        let mut s = String::new();
        let legend_rows = self.series.len().div_ceil(4);
        let height = H + 18.0 * legend_rows as f64 + 16.0 * self.notes.len() as f64;
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" viewBox="0 0 {W} {height}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(
            s,
            r#"<defs><clipPath id="plot-clip"><rect x="{LEFT}" y="{TOP}" width="{:.1}" height="{:.1}"/></clipPath></defs>"#,
            W - LEFT - RIGHT,
            H - TOP - BOTTOM
        );
        let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{LEFT}" y="22" font-size="15">{}</text>"#,
            escape(&self.title)
        );
        let t_max = self.t.last().copied().unwrap_or(0.0).max(0.001);
        let v_max = self
            .series
            .iter()
            .flat_map(|x| x.values.iter().flatten())
            .copied()
            .max()
            .unwrap_or(0);
        let y_ticks = byte_ticks(v_max);
        let y_top = y_ticks.last().copied().unwrap_or(1).max(1) as f64;
        let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
        let x_of = |t: f64| LEFT + pw * t / t_max;
        let y_of = |v: u64| TOP + ph * (1.0 - v as f64 / y_top);
        // Axes and grid.
        for &v in &y_ticks {
            let y = y_of(v);
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT + pw,
                LEFT - 6.0,
                y + 4.0,
                escape(&bytes(v))
            );
        }
        // The time axis, which the HTML page's script draws again when it
        // zooms (timeline.js).
        s.push_str("<g id=\"x-axis\">\n");
        let step = tick_step(t_max, 8.0);
        let mut t = 0.0;
        while t <= t_max + step * 1e-6 {
            let x = x_of(t);
            let _ = writeln!(
                s,
                r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#999"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                TOP + ph,
                TOP + ph + 5.0,
                TOP + ph + 18.0,
                if step < 1.0 {
                    format!("{t:.1}s")
                } else {
                    format!("{t:.0}s")
                }
            );
            t += step;
        }
        s.push_str("</g>\n");
        let _ = writeln!(
            s,
            r##"<rect x="{LEFT}" y="{TOP}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="#444"/>"##
        );
        // What the page's zoom stretches: the markers and the lines, kept
        // inside the plot.
        s.push_str("<g clip-path=\"url(#plot-clip)\"><g id=\"plot\">\n");
        // Markers under the lines.
        for m in &self.markers {
            let x = x_of(m.t);
            let colour = MARKER_COLOURS
                .iter()
                .find(|(k, _)| m.label.starts_with(k))
                .map_or("#555", |(_, c)| c);
            let _ = writeln!(
                s,
                r#"<line class="marker" x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="{colour}" stroke-dasharray="4 3" vector-effect="non-scaling-stroke"><title>{} at {:.1}s</title></line><text x="{:.1}" y="{:.1}" fill="{colour}" font-size="10">{}</text>"#,
                TOP + ph,
                escape(&m.label),
                m.t,
                x + 2.0,
                TOP + 10.0,
                escape(&m.label)
            );
        }
        // One polyline per unbroken run of a series.
        for (i, series) in self.series.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            let mut run: Vec<String> = Vec::new();
            let flush = |run: &mut Vec<String>, s: &mut String| {
                if !run.is_empty() {
                    let _ = writeln!(
                        s,
                        r#"<polyline class="series" data-name="{}" fill="none" stroke="{colour}" stroke-width="1.8" vector-effect="non-scaling-stroke" points="{}"/>"#,
                        escape(&series.name),
                        run.join(" ")
                    );
                    run.clear();
                }
            };
            for (k, v) in series.values.iter().enumerate() {
                match (v, self.t.get(k)) {
                    (Some(v), Some(&t)) => run.push(format!("{:.1},{:.1}", x_of(t), y_of(*v))),
                    _ => flush(&mut run, &mut s),
                }
            }
            flush(&mut run, &mut s);
        }
        s.push_str("</g></g>\n");
        // Legend, four to a row, with the last value.
        for (i, series) in self.series.iter().enumerate() {
            let (row, col) = (i / 4, i % 4);
            let x = LEFT + col as f64 * (pw / 4.0);
            let y = H + row as f64 * 18.0;
            let last = series.values.iter().rev().flatten().next().copied();
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="{:.1}" width="14" height="4" fill="{}"/><text x="{:.1}" y="{y:.1}">{} {}</text>"#,
                y - 5.0,
                COLOURS[i % COLOURS.len()],
                x + 18.0,
                escape(&series.name),
                last.map(|v| escape(&bytes(v))).unwrap_or_default()
            );
        }
        let notes_top = H + 18.0 * legend_rows as f64 + 4.0;
        for (i, n) in self.notes.iter().enumerate() {
            let _ = writeln!(
                s,
                r##"<text x="{LEFT}" y="{:.1}" fill="#555" font-size="11">{}</text>"##,
                notes_top + 16.0 * i as f64,
                escape(n)
            );
        }
        s.push_str("</svg>\n");
        s
    }

    /// A page with the chart, a table of each series (first, lowest,
    /// highest, last) and the events.
    pub fn html(&self) -> String {
        let mut s = String::new();
        let _ = write!(
            s,
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\n\
             <style>body{{font-family:sans-serif;margin:1.5em}}table{{border-collapse:collapse}}\
             td,th{{padding:2px 10px;text-align:right;border-bottom:1px solid #ddd}}\
             td:first-child,th:first-child{{text-align:left}}\
             #tip{{position:absolute;display:none;background:#fff;border:1px solid #888;padding:4px 8px;\
             font-size:12px;pointer-events:none;white-space:pre}}</style></head><body>\n\
             <p>Hover for the values at a moment; drag across the chart to zoom in time. \
             <button id=\"reset-zoom\" style=\"display:none\">Reset zoom</button></p>\n\
             <div id=\"chart\" style=\"position:relative\">",
            escape(&self.title)
        );
        s += &self.svg();
        s += "<div id=\"tip\"></div></div>\n";
        // The samples, for the script's hover and zoom. JSON is safe inside
        // <script> once `<` is escaped (no `</script>` can appear).
        let data = serde_json::json!({
            "t": self.t,
            "series": self.series.iter().map(|x| serde_json::json!({
                "name": x.name,
                "values": x.values,
                "shown": x.values.iter().map(|v| v.map(bytes)).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "geometry": {"left": LEFT, "top": TOP, "width": W - LEFT - RIGHT, "height": H - TOP - BOTTOM},
        });
        let _ = write!(
            s,
            "<script id=\"timeline-data\" type=\"application/json\">{}</script>\n<script>{}</script>\n",
            data.to_string().replace('<', "\\u003c"),
            include_str!("timeline.js")
        );
        s += "<h2>Series</h2>\n<table><tr><th>series</th><th>first</th><th>lowest</th><th>highest</th><th>last</th></tr>\n";
        for x in &self.series {
            let vals: Vec<u64> = x.values.iter().flatten().copied().collect();
            let cell = |v: Option<u64>| v.map(|v| escape(&bytes(v))).unwrap_or_else(|| "–".into());
            let _ = writeln!(
                s,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&x.name),
                cell(vals.first().copied()),
                cell(vals.iter().min().copied()),
                cell(vals.iter().max().copied()),
                cell(vals.last().copied())
            );
        }
        s += "</table>\n<h2>Events</h2>\n";
        if self.markers.is_empty() {
            s += "<p>none</p>\n";
        } else {
            s += "<table><tr><th>at</th><th>what</th></tr>\n";
            for m in &self.markers {
                let _ = writeln!(
                    s,
                    "<tr><td>{:.1} s</td><td>{}</td></tr>",
                    m.t,
                    escape(&m.label)
                );
            }
            s += "</table>\n";
        }
        s += "</body></html>\n";
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Timeline {
        Timeline {
            title: "pid 7 (a <b> & \"c\")".into(),
            t: vec![0.0, 0.5, 1.0, 1.5],
            series: vec![
                Series {
                    name: "rss".into(),
                    values: vec![
                        Some(10 << 20),
                        Some(200 << 20),
                        Some(20 << 20),
                        Some(21 << 20),
                    ],
                },
                Series {
                    name: "python".into(),
                    values: vec![None, Some(1 << 20), None, Some(2 << 20)],
                },
            ],
            markers: vec![Marker {
                t: 1.0,
                label: "purge 180.0 MiB".into(),
            }],
            notes: vec!["every 0.5 s".into()],
        }
    }

    #[test]
    fn svg_escapes_text_and_breaks_lines_where_a_value_is_missing() {
        let svg = sample().svg();
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.ends_with("</svg>\n"));
        assert!(svg.contains("pid 7 (a &lt;b&gt; &amp; &quot;c&quot;)"));
        assert_eq!(svg.matches(r#"data-name="rss""#).count(), 1);
        assert_eq!(svg.matches(r#"data-name="python""#).count(), 2);
        assert_eq!(svg.matches(r#"class="marker""#).count(), 1);
        // The highest value is inside the plot: its y is at or under TOP.
        assert!(byte_ticks(200 << 20).last().copied().unwrap() >= 200 << 20);
    }

    #[test]
    fn html_has_the_chart_the_table_and_the_events() {
        let html = sample().html();
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.contains("<svg"));
        assert!(html.contains(
            "<td>rss</td><td>10.0 MiB</td><td>10.0 MiB</td><td>200.0 MiB</td><td>21.0 MiB</td>"
        ));
        assert!(html.contains("<td>1.0 s</td><td>purge 180.0 MiB</td>"));
    }

    #[test]
    fn ticks_are_round() {
        assert_eq!(tick_step(10.0, 8.0), 2.0);
        assert_eq!(tick_step(60.0, 8.0), 10.0);
        assert_eq!(tick_step(0.8, 8.0), 0.1);
        let t = byte_ticks(300 << 20);
        assert_eq!(t[1], 100 << 20);
    }
}
