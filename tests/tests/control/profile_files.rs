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
