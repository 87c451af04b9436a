//! Bad configuration: every MEMSHIM_* variable with garbage, negative, huge
//! and empty values. The process runs as without the shim, with exactly one
//! `memshim: warning:` line per bad variable on stderr.

use memshim_tests::stress::{Level, figures};
use memshim_tests::*;

/// Variables of proto's settings table (`memshim_proto::settings::ALL`);
/// MEMSHIM_LIB is read by memshim-ctl only, so the shim must stay silent
/// about it.
const VARS: &[&str] = &[
    "MEMSHIM_DIRTY_DECAY_MS",
    "MEMSHIM_MUZZY_DECAY_MS",
    "MEMSHIM_NARENAS",
    "MEMSHIM_CONTROL",
    "MEMSHIM_SOCKET_DIR",
    "MEMSHIM_CLEAR_DEEPBIND",
    "MEMSHIM_MALLOC_CONF",
    "MEMSHIM_VERBOSE",
    "MEMSHIM_LIB",
];

fn values() -> Vec<(&'static str, String)> {
    vec![
        ("garbage", "x!y".into()),
        ("garbage-utf8", "\u{1F4A5}\u{7}".into()),
        ("negative", "-5".into()),
        ("huge", "99999999999999999999999".into()),
        ("long", format!("/{}", "a".repeat(5000))),
        ("empty", String::new()),
    ]
}

/// How many warning lines `var=value` must give.
fn expected(var: &str, value: &str) -> usize {
    match var {
        "MEMSHIM_LIB" => 0,
        // Empty means "no extra jemalloc options".
        "MEMSHIM_MALLOC_CONF" if value.is_empty() => 0,
        _ => 1,
    }
}

const PROGRAM: &str = "import sys, threading, hashlib\n\
t = threading.Thread(target=lambda: None); t.start(); t.join()\n\
print(hashlib.sha256(b''.join(bytes([i % 251]) * 1000 for i in range(2000))).hexdigest())";

pub fn run(level: Level) {
    let py = python();
    let base = Cmd::new(&py, ["-c", PROGRAM]).run();
    assert_eq!(base.code, 0, "{base:?}");
    let sh_base = Cmd::new("/bin/sh", ["-c", "echo ok; printf '%s\\n' done"]).run();
    let mut cases = 0;
    let mut vals = values();
    if level == Level::Smoke {
        vals.retain(|(k, _)| *k != "garbage-utf8");
    }
    for var in VARS {
        for (kind, value) in &vals {
            for (prog, args, want) in [
                (py.as_path(), vec!["-c", PROGRAM], &base),
                (
                    std::path::Path::new("/bin/sh"),
                    vec!["-c", "echo ok; printf '%s\\n' done"],
                    &sh_base,
                ),
            ] {
                let o = Cmd::new(prog, &args).shimmed().env(var, value).run();
                cases += 1;
                let ctx = format!(
                    "{var}={kind} ({} bytes) running {}",
                    value.len(),
                    prog.display()
                );
                assert_eq!(
                    (o.code, &o.stdout),
                    (want.code, &want.stdout),
                    "{ctx}: the process behaved differently"
                );
                let lines: Vec<&str> = o.stderr.lines().collect();
                assert_eq!(
                    lines.len(),
                    expected(var, value),
                    "{ctx}: stderr was {:?}",
                    o.stderr
                );
                for l in &lines {
                    assert!(
                        l.starts_with("memshim: warning: ") && l.contains(var),
                        "{ctx}: {l:?}"
                    );
                    assert!(l.len() <= 1100, "{ctx}: warning line of {} bytes", l.len());
                }
            }
        }
    }
    // Everything bad at once: one line per variable, nothing else.
    let mut c = Cmd::new(&py, ["-c", PROGRAM]).shimmed();
    let mut want_lines = 0;
    for var in VARS {
        c = c.env(var, "x!y");
        want_lines += expected(var, "x!y");
    }
    let o = c
        .env("MALLOC_CONF", "-5")
        .env("_RJEM_MALLOC_CONF", "narenas")
        .run();
    want_lines += 2;
    cases += 1;
    assert_eq!(
        (o.code, &o.stdout),
        (base.code, &base.stdout),
        "all bad at once: {o:?}"
    );
    assert_eq!(
        o.stderr.lines().count(),
        want_lines,
        "all bad at once: {}",
        o.stderr
    );
    assert!(
        o.stderr
            .lines()
            .all(|l| l.starts_with("memshim: warning: ")),
        "{}",
        o.stderr
    );
    figures(
        level,
        "bad_configuration",
        &[
            ("variables", VARS.len().to_string()),
            ("cases", cases.to_string()),
        ],
    );
}
