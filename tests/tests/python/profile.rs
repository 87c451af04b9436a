//! `memshim-ctl profile` of real CPythons: with `--python` (tracemalloc
//! through the bridge, every version) the line that keeps the memory, the
//! growth between two snapshots, the shim's deadline, the program's own
//! tracing left alone; and under `-X perf` (3.12+) the native profile names
//! the Python function, from the perf map CPython writes. pyenv's and
//! Debian sid's interpreters.

use memshim_proto::{PyTraceAction, Reply, Request};
use memshim_tests::py::*;
use memshim_tests::{Cmd, ctl};
use std::time::Duration;

/// The rows of the first table in `out` (after its `LIVE` header, up to
/// the blank line).
pub(crate) fn table_rows(out: &str) -> Vec<&str> {
    out.lines()
        .skip_while(|l| !l.trim_start().starts_with("LIVE"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .collect()
}

/// The rows of the table's "by Python line" part (after its header, up
/// to the blank line), largest first.
pub(crate) fn python_line_rows(out: &str) -> Vec<&str> {
    out.lines()
        .skip_while(|l| !l.starts_with("by Python line"))
        .skip(2)
        .take_while(|l| !l.trim().is_empty())
        .collect()
}

/// The fixture's line that keeps the memory, and its number.
pub(crate) fn grow_line() -> (String, u32) {
    let script = fixture_py("py_profile.py");
    let text = std::fs::read_to_string(&script).unwrap();
    let n = text
        .lines()
        .position(|l| l.contains("kept.append(bytearray(1 << 20))"))
        .unwrap() as u32
        + 1;
    (format!("{}:{n}", script.display()), n)
}

fn trace(
    sock: &std::path::Path,
    action: PyTraceAction,
    seconds: Option<u64>,
) -> memshim_proto::PyTraceReply {
    let req = Request::PythonTrace {
        action,
        frames: None,
        seconds,
        top: None,
    };
    match ok(request(sock, &req)) {
        Reply::PythonTrace(r) => *r,
        other => panic!("{other:?}"),
    }
}

#[test]
fn python_lines_name_the_line_that_keeps_the_memory_on_every_cpython() {
    let (where_, _) = grow_line();
    for py in cpythons() {
        let v = &py.label;
        let dir = socket_dir(&format!("pytrace-{}", py.tag()));
        let mut child = py.shimmed(&fixture_py("py_profile.py"), &[], &dir).spawn();
        child.wait_for_line("ready", Duration::from_secs(30));
        let pid = child.pid().to_string();
        let sock = socket_of(&dir, child.pid());
        // A first profile: tracemalloc on for 3 s, the growth inside.
        let run = Cmd::new(ctl(), ["profile", &pid, "--python", "--seconds", "3"]).spawn();
        memshim_tests::wait_until(Duration::from_secs(20), || {
            trace(&sock, PyTraceAction::Status, None)
                .tracing
                .then_some(())
        })
        .unwrap_or_else(|| panic!("{v}: tracemalloc never started"));
        child.send("grow");
        child.wait_for_line("grown", Duration::from_secs(30));
        let o = run.finish(Duration::from_secs(60));
        assert_eq!(o.code, 0, "{v}: {o:?}");
        let first = table_rows(&o.stdout).first().copied().unwrap_or("");
        assert!(
            first.contains(&where_) && first.contains("kept.append"),
            "{v}: the top line is the one that keeps the memory:\n{}",
            o.stdout
        );
        let share: f64 = first
            .split_whitespace()
            .nth(2)
            .unwrap()
            .trim_end_matches('%')
            .parse()
            .unwrap();
        assert!(share >= 80.0, "{v}: {first}");
        assert!(o.stderr.contains("tracemalloc started"), "{v}: {o:?}");
        // Switched off again afterwards.
        let s = trace(&sock, PyTraceAction::Status, None);
        assert!(!s.tracing, "{v}: {s:?}");

        // The shim's deadline stops what it started, with no client left.
        let s = trace(&sock, PyTraceAction::Start, Some(1));
        assert!(s.tracing && s.ours && s.changed, "{v}: {s:?}");
        memshim_tests::wait_until(Duration::from_secs(10), || {
            (!trace(&sock, PyTraceAction::Status, None).tracing).then_some(())
        })
        .unwrap_or_else(|| panic!("{v}: tracemalloc still on after its deadline"));

        // The program's own tracing is reported, never stopped.
        child.send("trace");
        child.wait_for_line("tracing", Duration::from_secs(10));
        let o = Cmd::new(ctl(), ["profile", &pid, "--python", "--json"]).run();
        assert_eq!(o.code, 0, "{v}: {o:?}");
        let r: memshim_proto::PyTraceReply = serde_json::from_str(&o.stdout).unwrap();
        assert!(r.tracing && !r.ours, "{v}: {r:?}");
        child.send("traced");
        assert_eq!(
            child
                .wait_for_line("traced", Duration::from_secs(10))
                .trim(),
            "traced True",
            "{v}"
        );

        child.send("quit");
        let done = child.finish(Duration::from_secs(30));
        assert_eq!((done.code, done.stderr.as_str()), (0, ""), "{v}: {done:?}");
    }
}

#[test]
fn python_growth_shows_only_what_grew() {
    let (where_, _) = grow_line();
    let py = default_python();
    let dir = socket_dir("pytrace-growth");
    let mut child = py.shimmed(&fixture_py("py_profile.py"), &[], &dir).spawn();
    child.wait_for_line("ready", Duration::from_secs(30));
    let pid = child.pid().to_string();
    socket_of(&dir, child.pid());
    let run = Cmd::new(
        ctl(),
        [
            "profile",
            &pid,
            "--python",
            "--seconds",
            "0",
            "--every",
            "3",
            "--count",
            "1",
        ],
    )
    .spawn();
    std::thread::sleep(Duration::from_millis(1500));
    child.send("grow");
    child.wait_for_line("grown", Duration::from_secs(30));
    let o = run.finish(Duration::from_secs(60));
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stdout.contains("growth 1 of 1"), "{}", o.stdout);
    let rows: Vec<&str> = table_rows(&o.stdout)
        .into_iter()
        .filter(|l| l.contains(" MiB "))
        .collect();
    assert_eq!(
        rows.len(),
        1,
        "only the line that grew holds MiB: {}",
        o.stdout
    );
    assert!(rows[0].contains(&where_), "{}", o.stdout);
    child.send("quit");
    assert_eq!(child.finish(Duration::from_secs(30)).code, 0);
}

/// Under `-X perf` the perf map names the trampolines too, kept with
/// `--native-frames all`.
#[test]
fn a_native_profile_names_the_python_function_under_x_perf() {
    let pythons: Vec<Cpython> = cpythons()
        .into_iter()
        .filter(|p| p.parsed() >= (3, 12, 0))
        .collect();
    assert!(!pythons.is_empty(), "no CPython 3.12 or newer to test");
    for py in pythons {
        let dir = socket_dir(&format!("profile-{}", py.tag()));
        let script = fixture_py("py_profile.py");
        let mut child = py
            .enter(
                Cmd::new(&py.exe, ["-X", "perf", &script.display().to_string()])
                    .shimmed()
                    .env("MEMSHIM_CONTROL", "on")
                    .env("MEMSHIM_SOCKET_DIR", &dir)
                    .env("MEMSHIM_PROFILE", "on"),
            )
            .spawn();
        child.wait_for_line("ready", Duration::from_secs(30));
        let pid = child.pid().to_string();
        socket_of(&dir, child.pid());
        let on = Cmd::new(ctl(), ["profile", &pid, "--seconds", "0", "--keep"]).run();
        assert_eq!(on.code, 0, "{}: {on:?}", py.label);
        child.send("grow");
        child.wait_for_line("grown", Duration::from_secs(30));
        // Folded (the default), the trampolines go with the interpreter's
        // frames, and the Python frames the samples carry name the line.
        let o = Cmd::new(ctl(), ["profile", &pid, "--keep"]).run();
        assert_eq!(o.code, 0, "{}: {o:?}", py.label);
        assert!(
            python_line_rows(&o.stdout)
                .first()
                .is_some_and(|l| l.contains("py_profile.py:") && l.contains("grow_here")),
            "{}: {}",
            py.label,
            o.stdout
        );
        let o = Cmd::new(ctl(), ["profile", &pid, "--native-frames", "all"]).run();
        assert_eq!(o.code, 0, "{}: {o:?}", py.label);
        let line = o
            .stdout
            .lines()
            .find(|l| l.starts_with("by Python function:"))
            .unwrap_or_else(|| panic!("{}: no Python functions in\n{}", py.label, o.stdout));
        let first = line.trim_start_matches("by Python function: ");
        assert!(
            first.starts_with("grow_here:") && first.contains("py_profile.py"),
            "{}: the function that keeps the memory comes first: {line}",
            py.label
        );
        eprintln!("{}: {line}", py.label);
        child.send("quit");
        let done = child.finish(Duration::from_secs(30));
        assert_eq!(done.code, 0, "{}: {done:?}", py.label);
    }
}

/// The line of `py_lines.py` that carries `mark`, as `py_lines.py:N`.
fn lines_fixture_line(mark: &str) -> String {
    let text = std::fs::read_to_string(fixture_py("py_lines.py")).unwrap();
    let n = text.lines().position(|l| l.contains(mark)).unwrap() + 1;
    format!("py_lines.py:{n}")
}

/// The bytes of the stacks of a `--format json` profile whose innermost
/// Python frame is at `place` (`file.py:N`), and all bytes.
fn held_at_python_line(profile: &serde_json::Value, place: &str) -> (i64, i64) {
    let mut at = 0;
    for s in profile["stacks"].as_array().unwrap() {
        let inner = s["frames"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["library"] == "[python]");
        if inner.is_some_and(|f| {
            f["source"]
                .as_str()
                .unwrap_or("")
                .ends_with(&format!("/{place}"))
        }) {
            at += s["bytes"].as_i64().unwrap();
        }
    }
    (at, profile["bytes"].as_i64().unwrap())
}

/// Python frames in native samples (no flag but `MEMSHIM_PROFILE=on`):
/// on every CPython, the two lines that allocated hold at least 80 % of
/// the sampled bytes, the one whose C code released the GIL (ctypes, on a
/// thread of its own) as well as the one that held it; the interpreter's
/// C frames are folded away unless `--native-frames all` asks for them.
#[test]
fn native_profiles_carry_python_lines_on_every_cpython() {
    let held = lines_fixture_line("LINE-GIL-HELD");
    let released = lines_fixture_line("LINE-GIL-RELEASED");
    for py in cpythons() {
        let v = &py.label;
        let (mut child, pid) = sampled(&py, "py_lines.py", "pylines", Duration::from_secs(30));
        child.send("grow");
        child.wait_for_line("grown", Duration::from_secs(30));

        let o = Cmd::new(ctl(), ["profile", &pid, "--json", "--keep"]).run();
        assert_eq!(o.code, 0, "{v}: {o:?}");
        let p: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
        let (a, total) = held_at_python_line(&p, &held);
        let (b, _) = held_at_python_line(&p, &released);
        eprintln!("{v}: {held} {a}, {released} {b} of {total} bytes");
        assert!(
            a > total / 5 && b > total / 5,
            "{v}: each line holds a share: {a} {b} of {total}"
        );
        assert!(
            (a + b) * 10 >= total * 8,
            "{v}: the two lines hold {a} + {b} of {total}"
        );
        // The held line's stack, folded (the default) and whole.
        let stack_at = |p: &serde_json::Value| -> Vec<serde_json::Value> {
            p["stacks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["frames"].as_array().unwrap().clone())
                .find(|fr| {
                    fr.iter().any(|f| {
                        f["source"]
                            .as_str()
                            .unwrap_or("")
                            .ends_with(&format!("/{held}"))
                    })
                })
                .unwrap_or_else(|| panic!("{v}: no stack at {held}"))
        };
        let folded = stack_at(&p);
        let all = Cmd::new(
            ctl(),
            [
                "profile",
                &pid,
                "--json",
                "--keep",
                "--native-frames",
                "all",
            ],
        )
        .run();
        assert_eq!(all.code, 0, "{v}: {all:?}");
        let whole = stack_at(&serde_json::from_str(&all.stdout).unwrap());
        // Woven in where the interpreter ran them: the outermost Python
        // frame sits inside a native frame of the interpreter (the library
        // of the frame that allocated, PyByteArray_Resize's), not at the
        // outer end of the stack.
        let interp = &whole[0]["library"];
        let outer_py = whole
            .iter()
            .rposition(|f| f["library"] == "[python]")
            .unwrap();
        assert!(
            whole
                .get(outer_py + 1)
                .is_some_and(|f| f["library"] == *interp),
            "{v}: the Python frames sit inside the interpreter's frame: {whole:?}"
        );
        // Folded: the interpreter's frames are gone but the one that
        // allocated.
        assert!(
            folded[1..]
                .iter()
                .all(|f| f["library"] != *interp && f["function"] != "_PyEval_EvalFrameDefault"),
            "{v}: the interpreter's frames are folded away by default: {folded:?}"
        );
        assert!(folded.len() < whole.len(), "{v}: {folded:?} {whole:?}");

        // pprof itself reads the Python frames as frames, `<module>` too.
        if memshim_tests::have("go") && (py.minor == "3.8" || py.minor == "3.15") {
            let pb = std::env::temp_dir().join(format!("memshim-pylines-{}.pb.gz", py.tag()));
            let o = Cmd::new(
                ctl(),
                [
                    "profile",
                    &pid,
                    "--keep",
                    "--format",
                    "pprof",
                    "-o",
                    &pb.display().to_string(),
                ],
            )
            .run();
            assert_eq!(o.code, 0, "{v}: {o:?}");
            let o = Cmd::new(
                "go",
                ["tool", "pprof", "-traces", &pb.display().to_string()],
            )
            .env("HOME", std::env::temp_dir())
            .run();
            let _ = std::fs::remove_file(&pb);
            assert_eq!(o.code, 0, "{v}: {o:?}");
            for f in ["load_weights", "scratch", "\u{2039}module\u{203a}"] {
                assert!(
                    o.stdout.contains(f),
                    "{v}: go tool pprof -traces names {f}:\n{}",
                    o.stdout
                );
            }
        }

        // The table's Python view names the two lines first.
        let t = Cmd::new(ctl(), ["profile", &pid]).run();
        assert_eq!(t.code, 0, "{v}: {t:?}");
        let rows: Vec<&str> = python_line_rows(&t.stdout).into_iter().take(2).collect();
        assert!(
            rows.iter()
                .any(|r| r.contains(&held) && r.contains("load_weights")
                    || r.contains(&held) && r.contains("<listcomp>"))
                && rows.iter().any(|r| r.contains(&released)),
            "{v}:\n{}",
            t.stdout
        );
        child.send("quit");
        let done = child.finish(Duration::from_secs(30));
        assert_eq!((done.code, done.stderr.as_str()), (0, ""), "{v}: {done:?}");
    }
}

/// A function whose code object and name strings were made where freed
/// ones had been (code built by `exec`, regenerated modules) is named as
/// itself: each of 40 rounds' `fn_N`, compiled from `gen_NN.py`, holds its
/// own 2 MiB in the profile under its own name and file. The table found
/// frames by the objects' addresses alone, and on CPython 3.8 to 3.11 gave
/// most rounds' bytes to an earlier round's names.
#[test]
fn a_function_made_where_a_freed_one_was_is_named_as_itself() {
    for py in cpythons() {
        let v = &py.label;
        let (mut child, pid) = sampled(&py, "py_reuse.py", "pyreuse", Duration::from_secs(30));
        child.send("grow");
        child.wait_for_line("grown", Duration::from_secs(60));
        let o = Cmd::new(ctl(), ["profile", &pid, "--json", "--keep"]).run();
        assert_eq!(o.code, 0, "{v}: {o:?}");
        let p: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
        let mut named = std::collections::BTreeSet::new();
        for s in p["stacks"].as_array().unwrap() {
            let Some(f) = s["frames"]
                .as_array()
                .unwrap()
                .iter()
                .find(|f| f["library"] == "[python]")
            else {
                continue;
            };
            let (function, source) = (
                f["function"].as_str().unwrap_or(""),
                f["source"].as_str().unwrap_or(""),
            );
            let Some(n) = function.strip_prefix("fn_") else {
                continue;
            };
            let n: u32 = n.parse().unwrap_or_else(|_| panic!("{v}: {function}"));
            assert_eq!(
                source,
                format!("/memshim-test/gen_{n:02}.py:2"),
                "{v}: {function} at {source}"
            );
            named.insert(n);
        }
        eprintln!("{v}: {} of 40 rounds named", named.len());
        assert!(named.len() >= 30, "{v}: rounds named: {named:?}");
        child.send("quit");
        let o = child.finish(Duration::from_secs(30));
        assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{v}: {o:?}");
    }
}

/// A module whose path is longer than a frame keeps (176 bytes) and not
/// ASCII (a home directory named in Japanese): its name keeps its end, as
/// an ASCII one does. It kept its start, and the profile named a file that
/// does not exist (`.../models/transform:5`).
#[test]
fn a_long_file_name_that_is_not_ascii_keeps_its_end() {
    let dir = memshim_tests::scratch()
        .join(format!("longpath-{}", std::process::id()))
        .join("ユーザー/プロジェクト/推論サービス/本番環境/仮想環境/lib/python3/site-packages/パッケージ")
        .join("models/transformer_blocks");
    std::fs::create_dir_all(&dir).unwrap();
    let module = dir.join("attention_layer.py");
    std::fs::write(
        &module,
        "kept = []\n\ndef build_cache():\n    for _ in range(24):\n        kept.append(bytearray(1 << 20))\n",
    )
    .unwrap();
    assert!(module.as_os_str().len() > 190);
    let script = format!(
        "import sys; sys.path.insert(0, {:?}); import attention_layer; attention_layer.build_cache(); \
         print('grown', flush=True); sys.stdin.readline()",
        dir.display().to_string()
    );
    let mut child = Cmd::new(memshim_tests::python(), ["-c", &script])
        .shimmed()
        .env("MEMSHIM_PROFILE", "start")
        .env("MEMSHIM_CONTROL", "on")
        .spawn();
    child.wait_for_line("grown", Duration::from_secs(30));
    memshim_tests::control::wait_endpoint(child.pid());
    let o = Cmd::new(ctl(), ["profile", &child.pid().to_string(), "--json"]).run();
    assert_eq!(o.code, 0, "{o:?}");
    let p: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    let source = p["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["frames"].as_array().unwrap().iter())
        .find(|f| f["function"] == "build_cache")
        .and_then(|f| f["source"].as_str())
        .unwrap_or_else(|| panic!("no build_cache frame: {p}"))
        .to_string();
    assert!(
        source.starts_with("...")
            && source.ends_with("/models/transformer_blocks/attention_layer.py:5"),
        "{source}"
    );
    child.send("");
    let o = child.finish(Duration::from_secs(10));
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    let _ = std::fs::remove_dir_all(
        memshim_tests::scratch().join(format!("longpath-{}", std::process::id())),
    );
}

/// `profile --python --keep` leaves tracemalloc on for an hour at most, as
/// `--keep` leaves sampling on for a day: it gave the shim the deadline of
/// a run without `--keep` (its seconds and a minute), and tracing stopped
/// a minute later.
#[test]
fn python_keep_leaves_tracemalloc_on_for_an_hour() {
    let mut child = Cmd::new(
        memshim_tests::python(),
        [
            "-c",
            "import sys; print('ready', flush=True); sys.stdin.readline()",
        ],
    )
    .shimmed()
    .env("MEMSHIM_CONTROL", "on")
    .spawn();
    child.wait_for_line("ready", Duration::from_secs(30));
    memshim_tests::control::wait_endpoint(child.pid());
    let pid = child.pid().to_string();
    let o = Cmd::new(
        ctl(),
        [
            "profile",
            &pid,
            "--python",
            "--keep",
            "--seconds",
            "0",
            "--json",
        ],
    )
    .run();
    assert_eq!(o.code, 0, "{o:?}");
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    let left = v["stops_in_ms"].as_u64().unwrap_or(0);
    assert!((3_500_000..=3_600_000).contains(&left), "{v}");
    let o = Cmd::new(ctl(), ["profile", &pid, "--python", "--stop"]).run();
    assert_eq!(o.code, 0, "{o:?}");
    child.send("");
    let o = child.finish(Duration::from_secs(10));
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
}

/// `timeout` (SIGTERM) or Ctrl-C ending `profile --python` of a process
/// without the preload during its wait: tracemalloc, which nothing stops
/// at a deadline on that road, stayed on for the program's life. It is
/// stopped first, and memshim-ctl then ends by that signal.
#[test]
fn a_profile_python_ended_by_a_signal_stops_the_tracing_it_started() {
    use std::os::unix::process::ExitStatusExt;
    let code = "import sys, tracemalloc\n\
                print('ready', flush=True)\n\
                for _ in sys.stdin: print('tracing', tracemalloc.is_tracing(), flush=True)\n";
    let mut child = Cmd::new(memshim_tests::python(), ["-c", code]).spawn();
    child.wait_for_line("ready", Duration::from_secs(30));
    let pid = child.pid().to_string();
    let mut c = std::process::Command::new(ctl())
        .args(["profile", &pid, "--python", "--seconds", "20"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Once tracing is on.
    memshim_tests::wait_until(Duration::from_secs(20), || {
        child.send("");
        (child.wait_for_line("tracing", Duration::from_secs(10)) == "tracing True").then_some(())
    })
    .expect("tracing started");
    // SAFETY: a signal to the memshim-ctl this test started.
    assert_eq!(unsafe { libc::kill(c.id() as i32, libc::SIGTERM) }, 0);
    let status = c.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(c.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?} {err}");
    assert!(err.contains("interrupted; tracemalloc stopped"), "{err}");
    child.send("");
    assert_eq!(
        child.wait_for_line("tracing", Duration::from_secs(10)),
        "tracing False"
    );
    drop(child);
}
