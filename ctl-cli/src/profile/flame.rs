//! The flame graph of a heap profile (`profile --format svg`), drawn by the
//! inferno crate: flamegraph.pl's interactive SVG, where a click zooms into
//! a frame, Ctrl-F (or "Search") highlights the frames that match, and each
//! box's tooltip gives its bytes and share. Outermost frames at the bottom,
//! each box as wide as the live bytes under it; each frame reads
//! `function (library)`. Growth only in a difference (what was freed is in
//! the table and the JSON). inferno is CDDL-1.0 (docs/design.md).

use crate::output::render::bytes;
use crate::output::timeline::escape;
use crate::profile::heap::Profile;
use inferno::flamegraph::{self, Options, Palette, color::BasicPalette};

/// The SVG document; `title` heads it.
pub fn svg(p: &Profile, title: &str) -> String {
    let lines = folded(p);
    let mut opts = Options::default();
    opts.title = title.to_string();
    opts.subtitle = Some(format!(
        "{} live, one sample per {} allocated",
        bytes(p.stacks.iter().map(|s| s.bytes.max(0)).sum::<i64>() as u64),
        bytes(1u64 << p.lg_sample.min(63)),
    ));
    opts.count_name = "bytes".into();
    opts.colors = Palette::Basic(BasicPalette::Mem);
    // The same function, the same colour, in every graph.
    opts.hash = true;
    if lines.is_empty() {
        return message(title, "no live sampled allocations");
    }
    let mut out = Vec::new();
    match flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), &mut out) {
        Ok(()) => String::from_utf8_lossy(&out).into_owned(),
        Err(e) => message(title, &format!("the flame graph failed: {e}")),
    }
}

/// A one-line SVG: `title: text`.
fn message(title: &str, text: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"800\" height=\"40\" font-family=\"monospace\"><text x=\"4\" y=\"24\">{}: {}</text></svg>\n",
        escape(title),
        escape(text)
    )
}

/// One line per stack with live bytes, `outer (lib);...;inner (lib) bytes`,
/// the frame separator and newlines taken out of names.
fn folded(p: &Profile) -> Vec<String> {
    p.stacks
        .iter()
        .filter(|s| s.bytes > 0)
        .map(|s| {
            let names: Vec<String> = s
                .frames
                .iter()
                .rev()
                .map(|f| format!("{} ({})", f.function, f.place()).replace([';', '\n'], "_"))
                .collect();
            format!("{} {}", names.join(";"), s.bytes)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::heap::sample_profile;

    #[test]
    fn the_graph_is_inferno_s_interactive_svg_with_a_box_per_frame() {
        let p = sample_profile();
        let s = svg(&p, "pid 7");
        assert!(s.contains("<svg"), "{s}");
        assert!(s.contains("pid 7"), "{s}");
        assert!(
            s.contains("leaf_odd (app) (2,097,152 bytes, 66.67%)"),
            "{s}"
        );
        assert!(s.contains("main (app) (3,145,728 bytes, 100.00%)"), "{s}");
        assert!(!s.contains("alloc_cpu"), "freed bytes drawn: {s}");
        // flamegraph.pl's script: zoom and search.
        assert!(
            s.contains("function zoom(") && s.contains("function search("),
            "the script is missing"
        );
        let empty = Profile {
            stacks: vec![],
            ..p
        };
        assert!(svg(&empty, "pid 7").contains("no live sampled allocations"));
    }
}
