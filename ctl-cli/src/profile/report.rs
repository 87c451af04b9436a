//! The self-contained HTML report of a heap profile (`profile -o
//! report.html`, or `--format html`): the table a terminal shows, then the
//! interactive flame graph (flame.rs: hover for each box's bytes, click to
//! zoom, search), embedded as an SVG document so that its script runs. One
//! file, nothing fetched: it opens from disk, in a mail or a ticket.

use crate::output::timeline::escape;
use crate::profile::heap::Profile;
use base64::Engine;

/// The HTML document: `title`, the `table` (text as `profile` prints it)
/// and the flame graph of `p`.
pub fn profile(p: &Profile, title: &str, table: &str) -> String {
    let svg = crate::profile::flame::svg(p, title);
    let data = base64::engine::general_purpose::STANDARD.encode(svg.as_bytes());
    format!(
        r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>memshim profile: {t}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}
h1 {{ font-size: 1.3em; }}
h2 {{ font-size: 1.1em; margin-top: 1.5em; }}
pre {{ background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }}
object {{ width: 100%; min-height: 400px; border: 1px solid #ddd; }}
</style>
</head>
<body>
<h1 id="title">memshim profile: {t}</h1>
<h2>Live memory by call site</h2>
<pre id="table">{table}</pre>
<h2>Flame graph</h2>
<p>Hover a box for its bytes, click it to zoom (Reset Zoom goes back), Ctrl-F or Search to highlight functions.</p>
<object id="flamegraph" type="image/svg+xml" data="data:image/svg+xml;base64,{data}"></object>
<p><small>memshim-ctl {v}; docs/profile.md says how to read a profile.</small></p>
</body>
</html>
"#,
        t = escape(title),
        table = table.lines().map(escape).collect::<Vec<_>>().join("\n") + "\n",
        v = env!("CARGO_PKG_VERSION"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::heap::test_profile;

    #[test]
    fn the_report_holds_the_table_and_the_flame_graph_in_one_file() {
        let p = test_profile(&[(1 << 20, &[("grow<T>", "app")])]);
        let h = profile(&p, "pid 7", "grow<T> 1.0 MiB\n");
        assert!(h.starts_with("<!DOCTYPE html>"));
        assert!(
            h.contains("<pre id=\"table\">grow&lt;T&gt; 1.0 MiB\n</pre>"),
            "{h}"
        );
        let b64 = h
            .split("data:image/svg+xml;base64,")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap();
        let svg = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        let svg = String::from_utf8(svg).unwrap();
        assert!(svg.contains("grow&lt;T&gt; (app)") && svg.contains("function zoom("));
    }
}
