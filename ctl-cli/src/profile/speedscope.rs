//! A heap profile in speedscope's file format (`profile --format
//! speedscope`), for <https://www.speedscope.app> or `speedscope FILE`:
//! one "sampled" profile whose samples are the live call stacks, outermost
//! frame first, each weighted by its live bytes (unit `bytes`). Frames are
//! shared: one entry per distinct function and library. Schema:
//! <https://www.speedscope.app/file-format-schema.json>. Stacks whose
//! figure is not positive (what a difference freed) are left out, as in
//! the flame graph.

use crate::profile::heap::Profile;
use crate::profile::symbols::Frame;
use serde_json::{Value, json};
use std::collections::HashMap;

/// The JSON document, one line.
pub fn encode(p: &Profile, title: &str) -> String {
    let mut index: HashMap<&Frame, usize> = HashMap::new();
    let mut frames: Vec<Value> = vec![];
    let mut samples: Vec<Vec<usize>> = vec![];
    let mut weights: Vec<i64> = vec![];
    for s in p.stacks.iter().filter(|s| s.bytes > 0) {
        let stack = s
            .frames
            .iter()
            .rev()
            .map(|f| {
                *index.entry(f).or_insert_with(|| {
                    let file = match f.file_line() {
                        Some((file, _)) if f.is_python() => file,
                        _ => f.library.as_str(),
                    };
                    let mut frame = json!({"name": f.function, "file": file});
                    // speedscope's `line`: where the library's debug
                    // information gives one.
                    if let Some((_, line)) = f.file_line() {
                        frame["line"] = json!(line);
                    }
                    frames.push(frame);
                    frames.len() - 1
                })
            })
            .collect();
        samples.push(stack);
        weights.push(s.bytes);
    }
    let total: i64 = weights.iter().sum();
    let doc = json!({
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": {"frames": frames},
        "profiles": [{
            "type": "sampled",
            "name": format!("{title}: live bytes"),
            "unit": "bytes",
            "startValue": 0,
            "endValue": total,
            "samples": samples,
            "weights": weights,
        }],
        "name": title,
        "activeProfileIndex": 0,
        "exporter": format!("memshim-ctl {}", env!("CARGO_PKG_VERSION")),
    });
    let mut out = doc.to_string();
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::heap::sample_profile;

    #[test]
    fn stacks_become_weighted_samples_outermost_first_with_shared_frames() {
        let p = sample_profile();
        let v: Value = serde_json::from_str(&encode(&p, "pid 7")).unwrap();
        let names: Vec<&str> = v["shared"]["frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["main", "leaf;odd", "other"]);
        let prof = &v["profiles"][0];
        assert_eq!(prof["type"], "sampled");
        assert_eq!(prof["unit"], "bytes");
        assert_eq!(prof["samples"], json!([[0, 1], [0, 2]]));
        assert_eq!(prof["weights"], json!([2 << 20, 1 << 20]));
        assert_eq!(prof["endValue"], json!(3 << 20));
    }
}
