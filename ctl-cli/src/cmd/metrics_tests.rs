//! Unit tests of metrics.rs: the Prometheus text it renders.

use super::*;

#[test]
fn label_values_are_escaped() {
    assert_eq!(
        escape(r#"a"b\c"#.to_owned().as_str()) + &escape("\n"),
        r#"a\"b\\c\n"#
    );
}

#[test]
fn each_family_has_help_and_type_once_and_contiguous_samples() {
    let mut r = StatsReport::default();
    r.allocator.resident = 4096;
    let samples = vec![
        ProcSample {
            pid: 1,
            command: "a".into(),
            stats: Ok(r.clone()),
        },
        ProcSample {
            pid: 2,
            command: "b \"x\"".into(),
            stats: Err("timed out".into()),
        },
        ProcSample {
            pid: 3,
            command: "c".into(),
            stats: Ok(r),
        },
    ];
    let text = render(&samples, &ScrapeInfo::default());
    let mut seen = std::collections::HashSet::new();
    let mut current = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            current = rest.split(' ').next().unwrap().to_owned();
            assert!(seen.insert(current.clone()), "{current} twice");
        } else if !line.starts_with('#') {
            assert!(
                line.starts_with(&current),
                "{line} outside its family {current}"
            );
        }
    }
    assert!(
        text.contains("memshim_up{pid=\"2\",command=\"b \\\"x\\\"\"} 0\n"),
        "{text}"
    );
    assert!(
        text.contains("memshim_allocator_bytes{pid=\"3\",command=\"c\",kind=\"resident\"} 4096\n"),
        "{text}"
    );
    assert!(
        !text.contains("pid=\"2\",command=\"b \\\"x\\\"\",kind"),
        "a failed process has no figures"
    );
}
