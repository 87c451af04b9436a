//! Every JSON example in docs/protocol.md decodes, and encodes back to the
//! very same bytes (so the document shows the real encoding).

use crate::{Request, Response, parse_request};

fn examples() -> Vec<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md"))
        .unwrap();
    let mut out = vec![];
    let mut in_json = false;
    for line in doc.lines() {
        match line.trim() {
            "```json" => in_json = true,
            "```" => in_json = false,
            l if in_json && !l.is_empty() => out.push(l.to_owned()),
            _ => {}
        }
    }
    out
}

#[test]
fn every_protocol_example_decodes_and_reencodes_identically() {
    let ex = examples();
    assert!(ex.len() >= 20, "only {} examples found", ex.len());
    let (mut requests, mut responses) = (0, 0);
    for line in &ex {
        if line.starts_with("{\"op\"") {
            let r: Request =
                parse_request(line.as_bytes()).unwrap_or_else(|e| panic!("{line}: {e:?}"));
            assert_eq!(&serde_json::to_string(&r).unwrap(), line);
            requests += 1;
        } else {
            let r = Response::from_line(line.as_bytes()).unwrap_or_else(|e| panic!("{line}: {e}"));
            assert_eq!(&serde_json::to_string(&r).unwrap(), line);
            responses += 1;
        }
    }
    assert!(
        requests >= 7 && responses >= 12,
        "{requests} requests, {responses} responses"
    );
}
