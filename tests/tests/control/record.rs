//! `memshim-ctl record`: a memory timeline of a real shimmed process,
//! written as SVG and HTML that an XML parser reads, with a marker where a
//! purge happened; its HTML page hovered and zoomed in Chromium; a process
//! that ends during the recording; bad paths.

use memshim_tests::control::{ctl_run, heap_fixture};
use memshim_tests::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn out_file(name: &str) -> PathBuf {
    let p = scratch().join(format!("record-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

/// Parses `file` as XML with Python's parser and prints, one per line, the
/// `data-name` of each polyline and the text of each marker's title.
fn parsed(file: &Path) -> Vec<String> {
    let src = r#"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
svg = root if root.tag.endswith('svg') else root.find('.//{http://www.w3.org/2000/svg}svg')
assert svg is not None, 'no svg element'
for e in svg.iter():
    if e.tag.endswith('polyline'):
        assert len(e.get('points').split()) >= 1
        print('line', e.get('data-name'))
    if e.tag.endswith('line') and e.get('class') == 'marker':
        print('marker', ''.join(e.itertext()))
"#;
    let o = Cmd::new(python(), ["-c", src, &file.display().to_string()]).run();
    assert_eq!(o.code, 0, "{} does not parse: {o:?}", file.display());
    o.stdout.lines().map(str::to_owned).collect()
}

/// `heap` (the control heap fixture) started, once it said so and its
/// endpoint is up.
fn started(heap: Cmd) -> Child {
    let mut heap = heap.spawn();
    heap.wait_for_line("started", Duration::from_secs(10));
    memshim_tests::control::wait_endpoint(heap.pid());
    heap
}

#[test]
fn a_recording_draws_each_figure_and_marks_a_purge() {
    let mut heap = started(
        Cmd::new(heap_fixture(), Vec::<String>::new())
            .shimmed()
            .env("MEMSHIM_DIRTY_DECAY_MS", "-1"),
    );
    let pid = heap.pid().to_string();
    let svg = out_file("a.svg");
    let args = ["record", &pid, "--seconds", "3", "--interval", "0.1", "-o"];
    let mut args: Vec<String> = args.map(String::from).to_vec();
    args.push(svg.display().to_string());
    let mut rec = Cmd::new(ctl(), args).spawn();
    // It says so once the first sample is in: what follows is drawn.
    rec.wait_for_line("recording pid", Duration::from_secs(10));
    heap.send("alloc 64");
    heap.wait_for_line("ready", Duration::from_secs(30));
    let purge = ctl_run(&["purge", &pid]);
    assert_eq!(purge.code, 0, "{purge:?}");
    let o = rec.finish(Duration::from_secs(30));
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stdout.contains("samples over"), "{}", o.stdout);
    assert!(o.stderr.is_empty(), "{}", o.stderr);
    let items = parsed(&svg);
    for name in ["RSS", "allocator resident", "allocator purgeable"] {
        assert!(
            items.contains(&format!("line {name}")),
            "{name} is drawn: {items:?}"
        );
    }
    assert!(
        items.iter().any(|i| i.starts_with("marker purge")),
        "the purge is marked: {items:?}"
    );

    // The page: the same chart, a table and the events.
    let html = out_file("a.html");
    let o = ctl_run(&[
        "record",
        &pid,
        "--seconds",
        "1",
        "-o",
        &html.display().to_string(),
    ]);
    assert_eq!(o.code, 0, "{o:?}");
    let text = std::fs::read_to_string(&html).unwrap();
    assert!(
        text.starts_with("<!DOCTYPE html>")
            && text.contains("<td>RSS</td>")
            && text.contains("<h2>Events</h2>"),
        "{text}"
    );
    heap.send("quit");
    let _ = heap.finish(Duration::from_secs(10));
    for f in [svg, html] {
        let _ = std::fs::remove_file(f);
    }
}

#[test]
fn a_process_that_ends_stops_the_recording_with_what_was_drawn() {
    let mut heap = started(Cmd::new(heap_fixture(), Vec::<String>::new()).shimmed());
    let pid = heap.pid().to_string();
    let svg = out_file("ends.svg");
    let mut rec = Cmd::new(
        ctl(),
        vec![
            "record".to_string(),
            pid.clone(),
            "--seconds".into(),
            "60".into(),
            "--interval".into(),
            "0.1".into(),
            "-o".into(),
            svg.display().to_string(),
        ],
    )
    .spawn();
    rec.wait_for_line("recording pid", Duration::from_secs(10));
    heap.send("quit");
    let _ = heap.finish(Duration::from_secs(10));
    let o = rec.finish(Duration::from_secs(20));
    assert_ne!(o.code, 0, "{o:?}");
    assert!(
        o.stderr.contains("the recording stopped after") && o.stderr.contains("ends.svg"),
        "{}",
        o.stderr
    );
    assert!(parsed(&svg).contains(&"line RSS".to_string()));
    let _ = std::fs::remove_file(svg);
}

#[test]
fn bad_outputs_and_pids_fail_before_recording() {
    let o = ctl_run(&["record", "1", "-o", "/tmp/x.png"]);
    assert_eq!(o.code, i32::from(memshim_proto::exit::USAGE.code), "{o:?}");
    assert!(o.stderr.contains(".svg or .html"), "{}", o.stderr);
    let o = ctl_run(&["record", "999999999", "-o", "/tmp/x.svg"]);
    assert_ne!(o.code, 0, "{o:?}");
    let mut heap = started(Cmd::new(heap_fixture(), Vec::<String>::new()).shimmed());
    let o = ctl_run(&[
        "record",
        &heap.pid().to_string(),
        "-o",
        "/proc/no-such-dir/x.svg",
    ]);
    assert_eq!(o.code, i32::from(memshim_proto::exit::FAILED.code), "{o:?}");
    assert!(o.stderr.contains("cannot write"), "{}", o.stderr);
    // A recording stopped on the way (a timeout, Ctrl-C) leaves no file,
    // and an earlier one as it was (it left an empty file, over the old).
    let earlier = out_file("kept.svg");
    std::fs::write(&earlier, "earlier\n").unwrap();
    let fresh = out_file("stopped.svg");
    for f in [&earlier, &fresh] {
        let mut run = Cmd::new(
            ctl(),
            [
                "record",
                &heap.pid().to_string(),
                "--seconds",
                "30",
                "-o",
                &f.display().to_string(),
            ],
        )
        .spawn();
        run.wait_for_line("recording pid", Duration::from_secs(10));
        // SAFETY: a signal to the memshim-ctl this test started.
        assert_eq!(unsafe { libc::kill(run.pid(), libc::SIGINT) }, 0);
        let o = run.finish(Duration::from_secs(10));
        assert_ne!(o.code, 0, "{o:?}");
    }
    assert_eq!(std::fs::read_to_string(&earlier).unwrap(), "earlier\n");
    assert!(!fresh.exists(), "{} left behind", fresh.display());
    heap.send("quit");
    let _ = heap.finish(Duration::from_secs(10));
}

/// The HTML page in headless Chromium, as a person uses it: hovering the
/// chart shows the nearest sample's time and each figure; dragging across
/// a quarter of it zooms in time (the lines stretched, the time axis drawn
/// again from later than 0, "Reset zoom" shown). Screenshots of the page
/// before and after are left in scratch (`profile-*-record-chart*.png`).
#[test]
fn the_html_page_shows_values_on_hover_and_zooms_on_a_drag_in_chromium() {
    if !memshim_tests::have("chromium") {
        memshim_tests::skip(
            "the timeline in Chromium: chromium is not installed (make test-deps installs it)",
        );
        return;
    }
    let mut heap = started(Cmd::new(heap_fixture(), Vec::<String>::new()).shimmed());
    let pid = heap.pid().to_string();
    let html = out_file("chart.html");
    let o = ctl_run(&[
        "record",
        &pid,
        "--seconds",
        "2",
        "--interval",
        "0.1",
        "-o",
        &html.display().to_string(),
    ]);
    assert_eq!(o.code, 0, "{o:?}");
    heap.send("quit");
    let _ = heap.finish(Duration::from_secs(10));
    let page = std::fs::read_to_string(&html).unwrap();
    super::profile::screenshot(&html, "record-chart.png", "1000,900");
    let person = r##"<script>
window.addEventListener("load", function () { setTimeout(function () {
  var svg = document.querySelector("#chart svg");
  var m = svg.getScreenCTM();
  var g = JSON.parse(document.getElementById("timeline-data").textContent).geometry;
  function at(x, y) { return { clientX: m.a * x + m.e, clientY: m.d * y + m.f, bubbles: true }; }
  var y = g.top + g.height / 2;
  svg.dispatchEvent(new MouseEvent("mousemove", at(g.left + g.width * 0.6, y)));
  document.body.setAttribute("data-tip", document.getElementById("tip").textContent);
  svg.dispatchEvent(new MouseEvent("mousedown", at(g.left + g.width * 0.5, y)));
  svg.dispatchEvent(new MouseEvent("mousemove", at(g.left + g.width * 0.75, y)));
  svg.dispatchEvent(new MouseEvent("mouseup", at(g.left + g.width * 0.75, y)));
}, 0); });
</script>
</body>"##;
    let (body, _) = page.rsplit_once("</body>").expect("an HTML page");
    let acted = out_file("chart-person.html");
    std::fs::write(&acted, format!("{body}{person}</html>\n")).unwrap();
    super::profile::screenshot(&acted, "record-chart-zoomed.png", "1000,600");
    let dom = super::profile::chromium(&acted, &["--dump-dom"]);
    assert_eq!(dom.code, 0, "{dom:?}");
    let d = &dom.stdout;
    // Hover: "1.2 s", then a line per figure with its value.
    let tip = d
        .split("data-tip=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or_else(|| panic!("no tooltip text: {}", &d[..d.len().min(2000)]));
    let mut lines = tip.lines();
    let when: f64 = lines
        .next()
        .and_then(|l| l.strip_suffix(" s"))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("the tooltip's first line is a time: {tip:?}"));
    assert!(
        (0.8..=1.8).contains(&when),
        "hovered at 60 % of 2 s: {tip:?}"
    );
    assert!(
        lines.any(|l| l.starts_with("RSS: ") && l.ends_with("MiB")),
        "the tooltip gives RSS: {tip:?}"
    );
    // Zoom: the lines stretched 4 times, the axis from 1 s on, Reset shown.
    let transform = d
        .split("id=\"plot\"")
        .nth(1)
        .and_then(|r| r.split("transform=\"matrix(").nth(1))
        .and_then(|r| r.split(',').next())
        .and_then(|a| a.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no zoom transform on #plot"));
    assert!((3.5..=4.5).contains(&transform), "stretched {transform}x");
    let axis = d.split("id=\"x-axis\"").nth(1).unwrap_or("");
    let first_label = axis
        .split("<text")
        .nth(1)
        .and_then(|t| t.split_once('>'))
        .and_then(|(_, r)| r.split("s<").next())
        .and_then(|t| t.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no time label on the axis"));
    assert!(
        first_label >= 0.9,
        "the zoomed axis starts at {first_label} s"
    );
    let reset = d.split("id=\"reset-zoom\"").nth(1).unwrap_or("");
    assert!(
        !reset.trim_start().starts_with("style=\"display: none")
            && !reset.trim_start().starts_with("style=\"display:none"),
        "Reset zoom is shown: {}",
        &reset[..reset.len().min(80)]
    );
    for f in [html, acted] {
        let _ = std::fs::remove_file(f);
    }
}
