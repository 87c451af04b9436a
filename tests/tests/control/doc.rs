//! The Python client printed in docs/protocol.md works against a real
//! shimmed process, as printed.

use memshim_tests::control::*;
use memshim_tests::*;
use std::time::Duration;

fn doc_client() -> String {
    let doc = std::fs::read_to_string(root().join("docs/protocol.md")).unwrap();
    let start = doc.find("```python\n").expect("a python block") + "```python\n".len();
    let len = doc[start..].find("```").unwrap();
    doc[start..start + len].to_owned()
}

#[test]
fn the_python_client_in_protocol_md_speaks_the_protocol() {
    let code = doc_client();
    assert!(
        code.lines().count() <= 35,
        "the documented client should stay short"
    );
    let mut child = start_heap(&[]);
    let pid = child.pid();
    wait_endpoint(pid);
    child.send("alloc 64");
    child.wait_for_line("ready", Duration::from_secs(20));
    let o = Cmd::new(python(), ["-c", &code, &pid.to_string()]).run();
    assert_eq!(o.code, 0, "{o:?}");
    let released: u64 = o
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("released "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{o:?}"));
    assert!(released > 16 << 20, "{o:?}");
    assert!(o.stdout.starts_with("rss "), "{o:?}");
}
