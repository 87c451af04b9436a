//! The files `profile` reads to name a process's functions: the very file
//! the process mapped, while it runs, even when the file at that path was
//! replaced since (an upgrade under a running server) or deleted.

use super::profile::{held_by, json_profile};
use memshim_tests::control::{ctl_run, wait_endpoint};
use memshim_tests::*;
use std::time::Duration;

/// profile_leak runs from a copy of its own; once it has kept its 64 MiB,
/// the file at the copy's path becomes another program (renamed over it,
/// as package managers replace files), then is deleted. Both times the
/// profile names `keep_sixty_four` from the file the process mapped
/// (`/proc/PID/map_files`); the new file's symbol table would have named
/// other functions, or none, at those addresses.
#[test]
fn a_replaced_or_deleted_executable_is_named_from_the_file_the_process_mapped() {
    let exe = scratch().join(format!("replaced-{}", std::process::id()));
    std::fs::copy(fixture("profile_leak", &[]), &exe).unwrap();
    let mut app = Cmd::new(&exe, Vec::<String>::new())
        .shimmed()
        .env("MEMSHIM_PROFILE", "on")
        .spawn();
    app.wait_for_line("started", Duration::from_secs(10));
    wait_endpoint(app.pid());
    let pid = app.pid().to_string();
    let o = ctl_run(&["profile", &pid, "--seconds", "0", "--keep"]);
    assert_eq!(o.code, 0, "{o:?}");
    app.send("first");
    app.wait_for_line("kept first", Duration::from_secs(10));

    // Another program at the same path.
    let other = exe.with_extension("new");
    std::fs::copy(fixture("idle_heap", &[]), &other).unwrap();
    std::fs::rename(&other, &exe).unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(maps.contains(" (deleted)"), "{maps}");
    for (when, name) in [("replaced", "replaced.json"), ("deleted", "deleted.json")] {
        if when == "deleted" {
            std::fs::remove_file(&exe).unwrap();
        }
        let (_, p) = json_profile(&pid, name);
        let total = p["bytes"].as_i64().unwrap();
        let leak = held_by(&p, "keep_sixty_four");
        assert!(
            leak as f64 >= 0.8 * total as f64 && leak > 32 << 20,
            "{when}: keep_sixty_four holds {leak} of {total} sampled live bytes: {p}"
        );
        let lib = p["stacks"][0]["frames"][0]["library"].as_str().unwrap();
        assert_eq!(lib, exe.file_name().unwrap().to_str().unwrap(), "{when}");
    }
    app.send("quit");
    let o = app.finish(Duration::from_secs(10));
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
}

/// A process in a mount namespace of its own (a container), whose separate
/// debug files are its user's: a regular debug file at its executable's
/// build id gives the profile its source lines; a FIFO, or a link to
/// `/dev/zero`, put there instead is passed over at once. memshim-ctl, as
/// root, waited for a writer to that FIFO for ever, or read `/dev/zero`
/// until it ran out of memory.
#[test]
fn a_containers_debug_file_gives_lines_and_a_fifo_or_device_there_is_passed_over() {
    if !memshim_tests::control::default_dir().ends_with("memshim-0") {
        eprintln!("SKIP: needs root for unshare -m");
        return;
    }
    // Stripped as Debian strips: the DWARF in a file of its own, which
    // the executable names (`.gnu_debuglink`, with its CRC); the file is
    // then moved away, so that only its build id finds it.
    let exe = scratch().join(format!("debugged-{}", std::process::id()));
    let debug = exe.with_extension("debug");
    std::fs::copy(fixture("profile_leak", &[]), &exe).unwrap();
    let (e, d) = (exe.display().to_string(), debug.display().to_string());
    for args in [
        vec!["--only-keep-debug", &e, &d],
        vec!["--strip-debug", "--add-gnu-debuglink", &d, &e],
    ] {
        let o = Cmd::new("objcopy", &args).run();
        assert_eq!(o.code, 0, "{o:?}");
    }
    let away = scratch().join(format!("debugged-{}-dbg", std::process::id()));
    let _ = std::fs::remove_dir_all(&away);
    std::fs::create_dir(&away).unwrap();
    let debug = away.join("the.debug");
    std::fs::rename(&d, &debug).unwrap();
    let notes = Cmd::new("readelf", ["-n", &exe.display().to_string()]).run();
    let id = notes
        .stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("cc writes a build id")
        .to_string();
    let (head, rest) = id.split_at(2);
    let at = format!("/usr/lib/debug/.build-id/{head}/{rest}.debug");
    for (kind, place) in [
        ("a debug file", format!("cp {} {at}", debug.display())),
        ("a FIFO", format!("mkfifo {at}")),
        ("a link to /dev/zero", format!("ln -s /dev/zero {at}")),
    ] {
        let script = format!(
            "mount -t tmpfs tmpfs /usr/lib/debug && mkdir -p /usr/lib/debug/.build-id/{head} && {place} && \
             exec env LD_PRELOAD={} MEMSHIM_PROFILE=on {}",
            shim().display(),
            exe.display()
        );
        let mut app = Cmd::new("unshare", ["-m", "sh", "-c", &script]).spawn();
        app.wait_for_line("started", Duration::from_secs(10));
        wait_endpoint(app.pid());
        let pid = app.pid().to_string();
        let o = ctl_run(&["profile", &pid, "--seconds", "0", "--keep"]);
        assert_eq!(o.code, 0, "{kind}: {o:?}");
        app.send("first");
        app.wait_for_line("kept first", Duration::from_secs(10));
        let out = scratch().join(format!("debugged-{}.json", std::process::id()));
        let o = Cmd::new(
            ctl(),
            [
                "profile",
                &pid,
                "--format",
                "json",
                "-o",
                &out.display().to_string(),
            ],
        )
        .run_timeout(Duration::from_secs(30));
        assert_eq!(o.code, 0, "{kind}: {o:?}");
        let p: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        let frame = p["stacks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| &s["frames"][0])
            .find(|f| f["function"] == "keep_sixty_four")
            .unwrap_or_else(|| panic!("{kind}: keep_sixty_four named from the symbol table: {p}"))
            .clone();
        let source = frame["source"].as_str().unwrap_or("");
        if kind == "a debug file" {
            assert!(source.starts_with("profile_leak.c:"), "{kind}: {frame}");
        } else {
            assert_eq!(source, "", "{kind}: {frame}");
        }
        app.send("quit");
        let o = app.finish(Duration::from_secs(10));
        assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{kind}: {o:?}");
    }
}
