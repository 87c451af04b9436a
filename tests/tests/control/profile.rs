//! `memshim-ctl profile`: a heap profile of a real shimmed process, taken
//! from outside. The function that keeps 64 MiB holds at least 80 % of the
//! sampled live bytes; the difference of two profiles around a second
//! leak shows only the second; the flame graph parses as SVG; a process
//! started without `MEMSHIM_PROFILE=on` gets `no_profiler` and how to turn it on;
//! sampling while the process forks and allocates stalls nothing.

use memshim_proto::exit::{FAILED, NO_PROFILER, NOT_FOUND, USAGE};
use memshim_tests::control::{ctl_run, wait_endpoint};
use memshim_tests::*;
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

fn out_file(name: &str) -> PathBuf {
    let p = scratch().join(format!("profile-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

/// The fixture under the shim with the profiler ready (or not), its
/// endpoint answering.
fn leaker(profile: bool) -> Child {
    let mut c = Cmd::new(fixture("profile_leak", &[]), Vec::<String>::new()).shimmed();
    if profile {
        c = c.env("MEMSHIM_PROFILE", "on");
    }
    let mut c = c.spawn();
    c.wait_for_line("started", Duration::from_secs(10));
    wait_endpoint(c.pid());
    c
}

/// One `profile` control request to `pid`, on its socket.
fn profile_request(
    pid: i32,
    action: memshim_proto::ProfileAction,
    seconds: Option<u64>,
) -> memshim_proto::Response {
    let dir = memshim_tests::endpoint::default_dir();
    let sock = memshim_tests::endpoint::socket_path(&dir, pid).expect("a socket");
    memshim_tests::py::request(&sock, &memshim_proto::Request::Profile { action, seconds })
}

/// Whether the process samples now (a `profile` status request).
fn sampling(pid: i32) -> bool {
    let r = profile_request(pid, memshim_proto::ProfileAction::Status, None);
    match memshim_tests::py::ok(r) {
        memshim_proto::Reply::Profile(r) => r.active,
        other => panic!("{other:?}"),
    }
}

/// Waits until a `memshim-ctl profile` started elsewhere has switched
/// sampling on.
fn wait_sampling(pid: i32) {
    wait_until(Duration::from_secs(20), || sampling(pid).then_some(()))
        .expect("sampling never started");
}

/// `profile PID --format FORMAT -o FILE` (it must succeed): the file.
fn profile_to(pid: &str, format: &str, name: &str) -> PathBuf {
    let f = out_file(name);
    let o = ctl_run(&[
        "profile",
        pid,
        "--format",
        format,
        "-o",
        &f.display().to_string(),
    ]);
    assert_eq!(o.code, 0, "{o:?}");
    f
}

/// `profile PID --format json -o FILE`, parsed.
pub(super) fn json_profile(pid: &str, name: &str) -> (PathBuf, Value) {
    let f = profile_to(pid, "json", name);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
    (f, v)
}

/// Bytes of the stacks whose allocating frame is `function`.
pub(super) fn held_by(p: &Value, function: &str) -> i64 {
    p["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["frames"][0]["function"] == function)
        .map(|s| s["bytes"].as_i64().unwrap())
        .sum()
}

#[test]
fn a_profile_names_the_function_that_keeps_the_memory_and_a_diff_the_new_leak() {
    let mut app = leaker(true);
    let pid = app.pid().to_string();
    // Switched on, and left on: what follows is sampled.
    let o = ctl_run(&["profile", &pid, "--seconds", "0", "--keep"]);
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stderr.contains("sampling started"), "{o:?}");
    app.send("first");
    app.wait_for_line("kept first", Duration::from_secs(10));

    let (p1, first) = json_profile(&pid, "1.json");
    let total = first["bytes"].as_i64().unwrap();
    let leak = held_by(&first, "keep_sixty_four");
    assert!(
        leak as f64 >= 0.8 * total as f64 && leak > 32 << 20,
        "keep_sixty_four holds {leak} of {total} sampled live bytes: {first}"
    );
    let lib = &first["stacks"][0]["frames"][0]["library"];
    assert_eq!(lib, "profile_leak", "{first}");

    let table = ctl_run(&["profile", &pid, "--top", "3"]);
    assert_eq!(table.code, 0, "{table:?}");
    let line = table
        .stdout
        .lines()
        .find(|l| l.contains("keep_sixty_four"))
        .unwrap_or_else(|| panic!("{}", table.stdout));
    assert!(line.contains("profile_leak"), "{line}");

    app.send("second");
    app.wait_for_line("kept second", Duration::from_secs(10));
    let (p2, _) = json_profile(&pid, "2.json");
    let o = ctl_run(&[
        "profile",
        "--diff",
        &p1.display().to_string(),
        &p2.display().to_string(),
        "--json",
    ]);
    assert_eq!(o.code, 0, "{o:?}");
    let diff: Value = serde_json::from_str(&o.stdout).unwrap();
    let grown = held_by(&diff, "keep_sixteen");
    assert!(grown > 8 << 20, "the second leak grew: {diff}");
    assert_eq!(
        held_by(&diff, "keep_sixty_four"),
        0,
        "only the second: {diff}"
    );
    assert_eq!(diff["bytes"].as_i64(), Some(grown), "nothing else: {diff}");

    // The flame graph, read by Python's XML parser; folded stacks.
    let svg = profile_to(&pid, "svg", "f.svg");
    let src = "import sys, xml.etree.ElementTree as ET\n\
root = ET.parse(sys.argv[1]).getroot()\n\
assert root.tag.endswith('svg'), root.tag\n\
print('\\n'.join(t.text or '' for t in root.iter() if t.tag.endswith('title')))";
    let o = Cmd::new(python(), ["-c", src, &svg.display().to_string()]).run();
    assert_eq!(o.code, 0, "the SVG does not parse: {o:?}");
    assert!(
        o.stdout.contains("keep_sixty_four (profile_leak)"),
        "{}",
        o.stdout
    );
    // pprof's format, decoded by the field numbers of pprof's profile.proto.
    let pb = profile_to(&pid, "pprof", "heap.pb.gz");
    let o = Cmd::new(python(), ["-c", PPROF_DECODER, &pb.display().to_string()]).run();
    assert_eq!(o.code, 0, "the pprof file does not decode: {o:?}");
    let mut lines = o.stdout.lines();
    assert_eq!(
        lines.next(),
        Some("types inuse_objects/count inuse_space/bytes period 524288")
    );
    let (mut leaks, mut total) = ([0i64; 2], 0i64);
    for l in lines {
        let (name, bytes) = l.trim_start_matches("sample ").rsplit_once(' ').unwrap();
        let bytes: i64 = bytes.parse().unwrap();
        total += bytes;
        match name {
            "keep_sixty_four" => leaks[0] += bytes,
            "keep_sixteen" => leaks[1] += bytes,
            _ => {}
        }
    }
    // Both leaks are live now: together nearly all of it.
    assert!(leaks[0] > 32 << 20 && leaks[1] > 8 << 20, "{}", o.stdout);
    assert!(
        (leaks[0] + leaks[1]) as f64 >= 0.9 * total as f64,
        "{}",
        o.stdout
    );
    // The same file, read by pprof itself (Debian's golang-go).
    if memshim_tests::have("go") {
        // `go tool pprof -top -sample_index=inuse_space [extra] FILE`.
        let pprof = |extra: &[&str]| {
            let pb = pb.display().to_string();
            let mut args = vec!["tool", "pprof", "-top", "-sample_index=inuse_space"];
            args.extend_from_slice(extra);
            args.push(&pb);
            let o = Cmd::new("go", args).env("HOME", scratch()).run();
            assert_eq!(o.code, 0, "go tool pprof {extra:?}: {o:?}");
            o
        };
        let o = pprof(&[]);
        let top: Vec<&str> = o.stdout.lines().filter(|l| l.contains('%')).collect();
        for f in ["keep_sixty_four", "keep_sixteen"] {
            assert!(
                top.iter().any(|l| l.split_whitespace().last() == Some(f)),
                "go tool pprof -top names {f}:\n{}",
                o.stdout
            );
        }
        // With the lines the fixture's DWARF gives (it is built with
        // `-g`): each function at the line of its `malloc(1 << 20)`.
        let o = pprof(&["-lines"]);
        let src = std::fs::read_to_string(root().join("tests/fixtures/profile_leak.c")).unwrap();
        for f in ["keep_sixty_four", "keep_sixteen"] {
            let start = src.find(&format!("{f}(void) {{")).unwrap();
            let line = src[..start].lines().count()
                + src[start..]
                    .lines()
                    .position(|l| l.contains("malloc(1 << 20)"))
                    .unwrap();
            let want = format!("{f} profile_leak.c:{line}");
            assert!(
                o.stdout.lines().any(|l| l.trim_end().ends_with(&want)),
                "go tool pprof -lines names {want}:\n{}",
                o.stdout
            );
        }
        // pprof can symbolize it again: the fixture's mapping carries the
        // file's path and build id, and `-symbolize=force` finds both
        // functions from the file (addr2line's source paths are whole,
        // the profile's own are file names).
        let exe = fixture("profile_leak", &[]);
        let notes = Cmd::new("readelf", ["-n".into(), exe.display().to_string()]).run();
        let build_id = notes
            .stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix("Build ID: "))
            .unwrap_or_else(|| panic!("the fixture has no build id: {notes:?}"))
            .to_string();
        let raw = |extra: &[&str]| {
            let pb = pb.display().to_string();
            let mut args = vec!["tool", "pprof", "-raw"];
            args.extend_from_slice(extra);
            args.push(&pb);
            let o = Cmd::new("go", args).env("HOME", scratch()).run();
            assert_eq!(o.code, 0, "go tool pprof -raw {extra:?}: {o:?}");
            o
        };
        let o = raw(&[]);
        let mapping = o
            .stdout
            .lines()
            .skip_while(|l| !l.starts_with("Mappings"))
            .find(|l| l.contains(&exe.display().to_string()))
            .unwrap_or_else(|| panic!("no mapping of the fixture: {}", o.stdout));
        assert!(mapping.contains(&build_id), "{mapping} lacks {build_id}");
        let o = raw(&["-symbolize=force"]);
        assert!(!o.stderr.contains("failed"), "{o:?}");
        for f in ["keep_sixty_four", "keep_sixteen"] {
            assert!(
                o.stdout
                    .lines()
                    .any(|l| l.contains(&format!(" {f} /")) && l.contains("/profile_leak.c:")),
                "go tool pprof -symbolize=force finds {f} in the fixture's file:\n{}",
                o.stdout
            );
        }
    } else {
        memshim_tests::skip(
            "go tool pprof: go is not installed (Debian package golang-go; make test-deps installs it)",
        );
    }
    let folded = ctl_run(&["profile", &pid, "--format", "folded"]);
    assert!(
        folded
            .stdout
            .lines()
            .any(|l| l.contains(";keep_sixty_four ") || l.starts_with("keep_sixty_four ")),
        "{folded:?}"
    );

    let o = ctl_run(&["profile", &pid, "--stop"]);
    assert_eq!(
        (o.code, o.stdout.trim()),
        (0, format!("pid {pid}: sampling stopped").as_str())
    );
    app.send("quit");
    let o = app.finish(Duration::from_secs(10));
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stderr.is_empty(), "{}", o.stderr);
}

/// Reads a gzipped `perftools.profiles.Profile` with nothing but the wire
/// format and the field numbers of pprof's proto/profile.proto; prints the
/// sample types, the period, and each sample's innermost function and
/// `inuse_space` value.
const PPROF_DECODER: &str = r#"
import gzip, sys
data = gzip.decompress(open(sys.argv[1], 'rb').read())
def varint(b, i):
    v = s = 0
    while True:
        c = b[i]; i += 1; v |= (c & 0x7f) << s; s += 7
        if c < 0x80: return v, i
def fields(b):
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        f, wt = key >> 3, key & 7
        if wt == 0: v, i = varint(b, i)
        elif wt == 2:
            n, i = varint(b, i); v = b[i:i + n]; i += n
        else: raise SystemExit('unexpected wire type %d' % wt)
        yield f, wt, v
def packed(v):
    out, i = [], 0
    while i < len(v):
        x, i = varint(v, i); out.append(x)
    return out
def msg(v): return {f: x for f, _, x in fields(v)}
strings, types, samples, locs, funcs, period = [], [], [], {}, {}, None
for f, wt, v in fields(data):
    if f == 1: types.append(msg(v))
    elif f == 2:
        s = {1: [], 2: []}
        for ff, w2, vv in fields(v): s[ff] += packed(vv) if w2 == 2 else [vv]
        samples.append(s)
    elif f == 4:
        loc = {ff: vv for ff, _, vv in fields(v) if ff != 4}
        loc['lines'] = [msg(vv) for ff, _, vv in fields(v) if ff == 4]
        locs[loc[1]] = loc
    elif f == 5: fn = msg(v); funcs[fn[1]] = fn
    elif f == 6: strings.append(v.decode())
    elif f == 12: period = v
assert strings[0] == '', 'string_table[0] must be empty'
print('types', ' '.join(strings[t[1]] + '/' + strings[t[2]] for t in types), 'period', period)
for s in samples:
    assert len(s[2]) == len(types), s
    fn = funcs[locs[s[1][0]]['lines'][0][1]]
    print('sample', strings[fn[2]], s[2][1])
"#;

#[test]
fn a_first_profile_samples_for_its_seconds_then_switches_sampling_off() {
    let mut app = leaker(true);
    let pid = app.pid().to_string();
    let f = out_file("window.json");
    let run = Cmd::new(
        ctl(),
        [
            "profile",
            &pid,
            "--seconds",
            "3",
            "--json",
            "-o",
            &f.display().to_string(),
        ],
    )
    .spawn();
    // Inside the window.
    wait_sampling(app.pid());
    app.send("first");
    app.wait_for_line("kept first", Duration::from_secs(10));
    let o = run.finish(Duration::from_secs(30));
    assert_eq!(o.code, 0, "{o:?}");
    let p: Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
    assert!(held_by(&p, "keep_sixty_four") > 32 << 20, "{p}");
    let o = ctl_run(&["profile", &pid, "--stop"]);
    assert_eq!(
        o.stdout.trim(),
        format!("pid {pid}: sampling was off"),
        "{o:?}"
    );
    // With --json, one JSON document (it was the line above).
    let o = ctl_run(&["profile", &pid, "--stop", "--json"]);
    let v: Value = serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("{e}: {o:?}"));
    assert_eq!(v["sampling"], "was off", "{v}");
    app.send("quit");
    assert_eq!(app.finish(Duration::from_secs(10)).code, 0);
}

/// `-o` naming a stream takes every step of `--every` down one stream, as
/// stdout does: `/dev/stdout` where the shell sent stdout to a regular
/// file (the steps went to new files `/dev/stdout.1`, `/dev/stdout.2`, and
/// nothing to the file), and a FIFO, which is opened once (opened again
/// for each step, its reader saw the end after the first, and the second
/// step waited for ever for a reader).
#[test]
fn growth_steps_to_a_stream_go_down_one_stream() {
    let mut app = leaker(true);
    let pid = app.pid().to_string();
    let o = ctl_run(&["profile", &pid, "--seconds", "0", "--keep"]);
    assert_eq!(o.code, 0, "{o:?}");
    let steps = |format: &str, out: &str| {
        [
            "profile",
            &pid,
            "--seconds",
            "0",
            "--every",
            "0.3",
            "--count",
            "2",
            "--keep",
            "--format",
            format,
            "-o",
            out,
        ]
        .map(String::from)
    };
    let file = out_file("stdout.pb.gz");
    let status = std::process::Command::new(ctl())
        .args(steps("pprof", "/dev/stdout"))
        .stdout(std::fs::File::create(&file).unwrap())
        .status()
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!std::path::Path::new("/dev/stdout.1").exists());
    let data = std::fs::read(&file).unwrap();
    let members = data.windows(3).filter(|w| w == &[0x1f, 0x8b, 0x08]).count();
    assert!(members >= 2, "two gzip members in {} bytes", data.len());
    let _ = std::fs::remove_file(&file);

    let fifo = out_file("steps.fifo");
    let o = Cmd::new("mkfifo", [&fifo]).run();
    assert_eq!(o.code, 0, "{o:?}");
    let got = out_file("fifo.json");
    let reader = std::process::Command::new("cp")
        .arg(&fifo)
        .arg(&got)
        .spawn()
        .unwrap();
    let writer = Cmd::new(ctl(), steps("json", &fifo.display().to_string())).spawn();
    let o = writer.finish(Duration::from_secs(30));
    assert_eq!(o.code, 0, "{o:?}");
    let status = reader.wait_with_output().unwrap().status;
    assert!(status.success(), "{status:?}");
    let text = std::fs::read_to_string(&got).unwrap();
    // One JSON document a line, one line a step.
    let docs: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(docs.len(), 2, "{text}");
    let _ = std::fs::remove_file(&fifo);
    let _ = std::fs::remove_file(&got);
    app.send("quit");
    assert_eq!(app.finish(Duration::from_secs(10)).code, 0);
}

/// `--every` in a format that makes whole files (JSON, SVG, pprof,
/// speedscope, HTML) writes one file per growth step, `FILE.N.EXT`, each
/// readable on its own (they were appended into one file that no reader
/// took); without `-o` it is a usage error. An output that cannot be
/// written fails before the sampling, not after it.
#[test]
fn growth_steps_in_whole_file_formats_go_one_file_each_and_a_bad_output_fails_at_once() {
    let mut app = leaker(true);
    let pid = app.pid().to_string();
    let o = ctl_run(&["profile", &pid, "--seconds", "0", "--keep"]);
    assert_eq!(o.code, 0, "{o:?}");
    for (format, ext) in [("json", "json"), ("svg", "svg"), ("pprof", "pb.gz")] {
        let base = out_file(&format!("steps.{ext}"));
        let f = base.display().to_string();
        let o = ctl_run(&[
            "profile",
            &pid,
            "--seconds",
            "0",
            "--every",
            "0.3",
            "--count",
            "2",
            "--keep",
            "--format",
            format,
            "-o",
            &f,
        ]);
        assert_eq!(o.code, 0, "{format}: {o:?}");
        assert!(!base.exists(), "{format}: {f} written as well");
        let steps: Vec<PathBuf> = (1..=2)
            .map(|n| {
                let name = format!("profile-{}-steps.{n}.{ext}", std::process::id());
                scratch().join(name)
            })
            .collect();
        for step in &steps {
            let data = std::fs::read(step).unwrap_or_else(|e| panic!("{}: {e}", step.display()));
            match format {
                "json" => {
                    let v: Value = serde_json::from_slice(&data).expect("one JSON document");
                    assert!(v["stacks"].is_array(), "{v}");
                }
                "svg" => {
                    let text = String::from_utf8(data).unwrap();
                    assert_eq!(text.matches("</svg>").count(), 1, "one SVG document");
                    assert!(text.trim_end().ends_with("</svg>"), "{}", step.display());
                }
                _ => assert_eq!(&data[..2], &[0x1f, 0x8b], "gzip: {}", step.display()),
            }
            let _ = std::fs::remove_file(step);
        }
    }
    // Without --format, the name given to -o chooses it.
    for (name, head) in [
        ("named.svg", &b"<?xml"[..]),
        ("named.pb.gz", &[0x1f, 0x8b][..]),
    ] {
        let f = out_file(name);
        let o = ctl_run(&[
            "profile",
            &pid,
            "--seconds",
            "0",
            "--keep",
            "-o",
            &f.display().to_string(),
        ]);
        assert_eq!(o.code, 0, "{name}: {o:?}");
        let data = std::fs::read(&f).unwrap();
        assert!(
            data.starts_with(head),
            "{name}: {:?}",
            &data[..data.len().min(16)]
        );
    }
    let o = ctl_run(&["profile", &pid, "--every", "0.3", "--format", "svg"]);
    assert_eq!(o.code, i32::from(USAGE.code), "{o:?}");
    assert!(o.stderr.contains("-o FILE"), "{}", o.stderr);
    // A directory that does not exist: said before the 30 s of sampling.
    let t = std::time::Instant::now();
    let o = ctl_run(&[
        "profile",
        &pid,
        "--seconds",
        "30",
        "-o",
        "/nonexistent-memshim-dir/heap.svg",
    ]);
    assert_eq!(o.code, i32::from(FAILED.code), "{o:?}");
    assert!(
        o.stderr
            .contains("writing /nonexistent-memshim-dir/heap.svg"),
        "{o:?}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "after {:?}",
        t.elapsed()
    );
    app.send("quit");
    let o = app.finish(Duration::from_secs(10));
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
}

/// `reset` forgets the samples, and the window the header gives ("sampling
/// on for N s", `active_ms`) starts again with it: it counted from when
/// sampling started, which halved the growth rate a reader worked out.
#[test]
fn a_reset_starts_the_sampling_window_again() {
    let mut app = leaker(true);
    let pid = app.pid();
    let o = ctl_run(&["profile", &pid.to_string(), "--seconds", "0", "--keep"]);
    assert_eq!(o.code, 0, "{o:?}");
    std::thread::sleep(Duration::from_millis(1500));
    let active_ms = |action| match memshim_tests::py::ok(profile_request(pid, action, None)) {
        memshim_proto::Reply::Profile(r) => r.active_ms.expect("sampling is on"),
        other => panic!("{other:?}"),
    };
    let before = active_ms(memshim_proto::ProfileAction::Status);
    assert!(before >= 1500, "{before} ms");
    let after = active_ms(memshim_proto::ProfileAction::Reset);
    assert!(
        after < before && after < 1000,
        "{after} ms after the reset, {before} before"
    );
    let o = ctl_run(&["profile", &pid.to_string(), "--stop"]);
    assert_eq!(o.code, 0, "{o:?}");
    app.send("quit");
    assert_eq!(app.finish(Duration::from_secs(10)).code, 0);
}

#[test]
fn without_memshim_profile_the_answer_is_no_profiler_and_how_to_turn_it_on() {
    let mut app = leaker(false);
    let pid = app.pid().to_string();
    let o = ctl_run(&["profile", &pid, "--seconds", "0"]);
    assert_eq!(o.code, i32::from(NO_PROFILER.code), "{o:?}");
    assert!(o.stderr.contains("MEMSHIM_PROFILE=on"), "{}", o.stderr);
    assert!(o.stdout.is_empty(), "{}", o.stdout);
    app.send("quit");
    let o = app.finish(Duration::from_secs(10));
    assert_eq!(o.code, 0, "{o:?}");
    // Bad uses: a diff of files that are not profiles, no pid.
    let junk = out_file("junk.json");
    std::fs::write(&junk, "{}").unwrap();
    let j = junk.display().to_string();
    let o = ctl_run(&["profile", "--diff", &j, &j]);
    assert_eq!(o.code, i32::from(FAILED.code), "{o:?}");
    assert!(o.stderr.contains("not a profile"), "{}", o.stderr);
    assert_eq!(ctl_run(&["profile"]).code, i32::from(USAGE.code));
    // Options a diff or --python has no use for are refused, not ignored.
    for extra in [&["--seconds", "5"][..], &["--every", "1"], &["--keep"]] {
        let mut args = vec!["profile", "--diff", &j, &j];
        args.extend_from_slice(extra);
        let o = ctl_run(&args);
        assert_eq!(o.code, i32::from(USAGE.code), "{extra:?}: {o:?}");
        assert!(o.stderr.contains("cannot be used with"), "{o:?}");
    }
    let o = ctl_run(&["profile", &pid, "--python", "--native-frames", "all"]);
    assert_eq!(o.code, i32::from(USAGE.code), "{o:?}");
    assert!(o.stderr.contains("cannot be used with"), "{o:?}");
}

#[test]
fn profiles_taken_while_the_process_forks_and_allocates_stall_nothing() {
    let mut app = leaker(true);
    let pid = app.pid().to_string();
    let stormed = |app: &mut Child| -> u64 {
        let line = app.wait_for_line("stormed", Duration::from_secs(30));
        line.trim_start_matches("stormed ").trim().parse().unwrap()
    };
    // The same storm without sampling first: how many forks this machine
    // does in 3 s now (other load moves it).
    app.send("storm 100 3");
    let unsampled = stormed(&mut app);
    assert_eq!(
        ctl_run(&["profile", &pid, "--seconds", "0", "--keep"]).code,
        0
    );
    // 3 s of four allocating threads and about 100 forks a second, with a
    // profile taken as fast as memshim-ctl can ask.
    app.send("storm 100 3");
    let mut dumps = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < deadline {
        let o = ctl_run(&["profile", &pid, "--json"]);
        assert_eq!(o.code, 0, "{o:?}");
        dumps += 1;
    }
    let sampled = stormed(&mut app);
    assert!(
        sampled * 3 >= unsampled && sampled >= 10 && dumps > 2,
        "{sampled} forks while sampled and profiled ({dumps} profiles), {unsampled} without"
    );
    assert_eq!(ctl_run(&["profile", &pid, "--stop"]).code, 0);
    app.send("quit");
    let o = app.finish(Duration::from_secs(10));
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stderr.is_empty(), "{}", o.stderr);
}

#[test]
fn a_process_that_exits_while_it_is_profiled_exits_as_it_would_and_the_profile_says_so() {
    let mut app = leaker(true);
    let pid = app.pid().to_string();
    let run = Cmd::new(ctl(), ["profile", &pid, "--seconds", "2"]).spawn();
    wait_sampling(app.pid());
    // The process ends during the window.
    app.send("first");
    app.wait_for_line("kept first", Duration::from_secs(10));
    app.send("quit");
    let t0 = std::time::Instant::now();
    let o = app.finish(Duration::from_secs(10));
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stderr.is_empty(), "{}", o.stderr);
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "the exit waited {:?}",
        t0.elapsed()
    );
    let p = run.finish(Duration::from_secs(30));
    assert_eq!(
        p.code,
        i32::from(NOT_FOUND.code),
        "no such process any more: {p:?}"
    );
    assert!(p.stdout.is_empty(), "{p:?}");
}

#[test]
fn memshim_profile_start_samples_from_the_start_and_profile_leaves_it_on() {
    let mut app = Cmd::new(fixture("profile_leak", &[]), Vec::<String>::new())
        .shimmed()
        .env("MEMSHIM_PROFILE", "start")
        .spawn();
    app.wait_for_line("started", Duration::from_secs(10));
    // Before any memshim-ctl command.
    app.send("first");
    app.wait_for_line("kept first", Duration::from_secs(10));
    wait_endpoint(app.pid());
    let pid = app.pid().to_string();
    let (_, p) = json_profile(&pid, "start.json");
    assert!(held_by(&p, "keep_sixty_four") > 32 << 20, "{p}");
    // `profile` did not switch it on, so it did not switch it off.
    let o = ctl_run(&["profile", &pid, "--stop"]);
    assert_eq!(
        o.stdout.trim(),
        format!("pid {pid}: sampling stopped"),
        "{o:?}"
    );
    app.send("quit");
    let o = app.finish(Duration::from_secs(10));
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
}

#[test]
fn sampling_a_request_started_stops_at_its_deadline_with_no_client_left() {
    use memshim_proto::{ProfileAction, Reply};
    let mut app = leaker(true);
    let start = profile_request(app.pid(), ProfileAction::Start, Some(1));
    let Reply::Profile(r) = memshim_tests::py::ok(start) else {
        panic!()
    };
    assert!(
        r.active && r.changed && r.stops_in_ms.is_some_and(|ms| ms <= 1000),
        "{r:?}"
    );
    wait_until(Duration::from_secs(10), || {
        (!sampling(app.pid())).then_some(())
    })
    .expect("sampling still on after its deadline");
    let e = profile_request(app.pid(), ProfileAction::Start, Some(0));
    assert!(
        matches!(e, memshim_proto::Response::Error(ref e) if e.code == memshim_proto::ErrorCode::InvalidArgument),
        "{e:?}"
    );
    app.send("quit");
    assert_eq!(app.finish(Duration::from_secs(10)).code, 0);
}

/// `--format speedscope`: a sampled profile, weighted by live bytes, that
/// speedscope opens; the function that keeps the memory is a frame, and
/// its samples weigh what the JSON profile says it holds.
#[test]
fn a_speedscope_profile_weighs_each_stack_by_its_live_bytes() {
    let mut app = sampled_leaker(&["first"]);
    let pid = app.pid().to_string();
    let f = profile_to(&pid, "speedscope", "s.speedscope.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
    assert_eq!(
        v["$schema"], "https://www.speedscope.app/file-format-schema.json",
        "{v}"
    );
    let frames = v["shared"]["frames"].as_array().unwrap();
    let leak = frames
        .iter()
        .position(|f| f["name"] == "keep_sixty_four")
        .unwrap_or_else(|| panic!("no keep_sixty_four frame: {v}"));
    let prof = &v["profiles"][0];
    assert_eq!(
        (&prof["type"], &prof["unit"]),
        (&"sampled".into(), &"bytes".into())
    );
    let samples = prof["samples"].as_array().unwrap();
    let weights = prof["weights"].as_array().unwrap();
    assert_eq!(samples.len(), weights.len(), "{prof}");
    let held: i64 = samples
        .iter()
        .zip(weights)
        .filter(|(s, _)| s.as_array().unwrap().last() == Some(&leak.into()))
        .map(|(_, w)| w.as_i64().unwrap())
        .sum();
    assert!(held > 32 << 20, "keep_sixty_four weighs {held}: {prof}");
    app.send("quit");
    let o = app.finish(Duration::from_secs(10));
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
}

/// The flame graph as a person uses it, in headless Chromium: a click on a
/// frame zooms into it (the others hide, "Reset Zoom" shows), and a search
/// highlights the frames that match and says how much they hold. Checked
/// on the DOM Chromium ends with; a screenshot is left in scratch.
#[test]
fn the_flame_graph_zooms_on_a_click_and_highlights_a_search_in_chromium() {
    if !memshim_tests::have("chromium") {
        memshim_tests::skip(
            "the flame graph in Chromium: chromium is not installed (make test-deps installs it)",
        );
        return;
    }
    let mut app = sampled_leaker(&["first", "second"]);
    let pid = app.pid().to_string();
    let svg = std::fs::read_to_string(profile_to(&pid, "svg", "chromium.svg")).unwrap();
    app.send("quit");
    assert_eq!(app.finish(Duration::from_secs(10)).code, 0);
    // What a person does: search for one leak, then click the other.
    // (inferno's `init` runs on the SVG's own load event; `searchbtn` is
    // its variable, set there.)
    let person = r##"<script type="text/ecmascript"><![CDATA[
function person() {
  if (!searchbtn) { setTimeout(person, 10); return; }
  search("keep_sixteen");
  var gs = document.querySelectorAll("#frames > g");
  for (var i = 0; i < gs.length; i++)
    if (gs[i].querySelector("title").textContent.indexOf("keep_sixty_four ") == 0)
      gs[i].dispatchEvent(new MouseEvent("click", {bubbles: true}));
}
window.addEventListener("load", function() { setTimeout(person, 0); });
]]></script>
</svg>"##;
    // Before the document's own end (the frames are an <svg> inside it).
    let (body, _) = svg.rsplit_once("</svg>").expect("an SVG document");
    let page = out_file("chromium-person.svg");
    std::fs::write(&page, format!("{body}{person}\n")).unwrap();
    let dom = chromium(&page, &["--dump-dom"]);
    assert_eq!(dom.code, 0, "{dom:?}");
    let d = &dom.stdout;
    // The search: "Matched: N%", N > 0.
    let matched = d
        .split("id=\"matched\"")
        .nth(1)
        .and_then(|r| r.split_once('>'))
        .map(|(_, r)| r.split('<').next().unwrap_or(""))
        .unwrap_or("");
    let pct: f64 = matched
        .trim()
        .strip_prefix("Matched: ")
        .and_then(|p| p.trim_end_matches('%').parse().ok())
        .unwrap_or_else(|| panic!("no match count after the search: {matched:?}"));
    assert!(pct > 0.0 && pct < 100.0, "{matched}");
    // The click: "Reset Zoom" shown, the other leak's frame hidden.
    let unzoom = d.split("id=\"unzoom\"").nth(1).unwrap_or("");
    assert!(
        unzoom.trim_start().starts_with("class=\"\""),
        "Reset Zoom is not shown after the click: {}",
        &unzoom[..unzoom.len().min(80)]
    );
    let frame_of = |f: &str| {
        d.split("<g")
            .find(|g| g.contains(&format!("<title>{f} (profile_leak)")))
            .unwrap_or_else(|| panic!("no frame of {f}"))
            .to_string()
    };
    assert!(
        frame_of("keep_sixteen").contains("class=\"hide\""),
        "keep_sixteen is not hidden by the zoom"
    );
    assert!(!frame_of("keep_sixty_four").contains("class=\"hide\""));
    screenshot(&page, "flamegraph.png", "1200,900");
}

/// The leaker with sampling on from before `steps` (each a leak it makes
/// and reports), made.
fn sampled_leaker(steps: &[&str]) -> Child {
    let mut app = leaker(true);
    let pid = app.pid().to_string();
    let o = ctl_run(&["profile", &pid, "--seconds", "0", "--keep"]);
    assert_eq!(o.code, 0, "{o:?}");
    for step in steps {
        app.send(step);
        app.wait_for_line(&format!("kept {step}"), Duration::from_secs(10));
    }
    app
}

/// A screenshot of `page` by Chromium at `size` ("width,height"), left in
/// scratch as `name`: a PNG of more than 10 kB (a blank page is less).
pub(super) fn screenshot(page: &std::path::Path, name: &str, size: &str) {
    let shot = out_file(name);
    let o = chromium(
        page,
        &[
            "--hide-scrollbars",
            &format!("--window-size={size}"),
            &format!("--screenshot={}", shot.display()),
        ],
    );
    assert_eq!(o.code, 0, "{o:?}");
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{name}: {} bytes",
        png.len()
    );
}

/// Headless Chromium on the file `page` with `extra` arguments (its own
/// empty profile directory, no network of its own), finished.
pub(super) fn chromium(page: &std::path::Path, extra: &[&str]) -> memshim_tests::Output {
    // One profile directory per run: Chromium locks its directory.
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let profile_dir = out_file(&format!("chromium-user-data-{n}"));
    let _ = std::fs::remove_dir_all(&profile_dir);
    let mut args = vec![
        "--headless".to_string(),
        "--no-sandbox".into(),
        "--disable-gpu".into(),
        "--no-first-run".into(),
        "--disable-background-networking".into(),
        "--disable-component-update".into(),
        "--disable-sync".into(),
        format!("--user-data-dir={}", profile_dir.display()),
        "--virtual-time-budget=5000".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args.push(format!("file://{}", page.display()));
    Cmd::new("chromium", args).run()
}

/// `profile -o report.html`: one self-contained file with the table and
/// the flame graph, as Chromium shows it (its DOM, and a screenshot left
/// in scratch).
#[test]
fn an_html_report_holds_the_table_and_the_flame_graph_in_one_file() {
    let mut app = sampled_leaker(&["first"]);
    let pid = app.pid().to_string();
    let page = out_file("report.html");
    let o = ctl_run(&["profile", &pid, "-o", &page.display().to_string()]);
    assert_eq!((o.code, o.stdout.as_str()), (0, ""), "{o:?}");
    app.send("quit");
    assert_eq!(app.finish(Duration::from_secs(10)).code, 0);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"), "{html}");
    assert!(
        !html.contains("http://")
            || html.matches("http://").count() == html.matches("xmlns").count(),
        "nothing is fetched: {html}"
    );
    if !memshim_tests::have("chromium") {
        memshim_tests::skip(
            "the HTML report in Chromium: chromium is not installed (make test-deps installs it)",
        );
        return;
    }
    let dom = chromium(&page, &["--dump-dom"]);
    assert_eq!(dom.code, 0, "{dom:?}");
    let table = dom
        .stdout
        .split("<pre id=\"table\">")
        .nth(1)
        .and_then(|r| r.split("</pre>").next())
        .unwrap_or_else(|| panic!("no table in {}", dom.stdout));
    assert!(
        table
            .lines()
            .any(|l| l.contains("keep_sixty_four") && l.contains("profile_leak")),
        "{table}"
    );
    assert!(
        dom.stdout
            .contains("<object id=\"flamegraph\" type=\"image/svg+xml\""),
        "{}",
        dom.stdout
    );
    screenshot(&page, "report.png", "1200,1000");
}
