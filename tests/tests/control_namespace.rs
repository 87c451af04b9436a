//! A shimmed process in its own pid and mount namespace (a container
//! without a container engine: `unshare -pmf --mount-proc` plus a private
//! /tmp) is reachable from outside, through /proc/<pid>/root and NSpid.

mod control_support;

use control_support::*;
use memshim_tests::*;
use std::time::Duration;

#[test]
fn a_process_in_another_pid_and_mount_namespace_is_reachable_from_outside() {
    if !default_dir().ends_with("memshim-0") {
        eprintln!("SKIP: needs root for unshare -pm");
        return;
    }
    let probe = Cmd::new("unshare", ["-pmf", "--mount-proc", "true"]).run();
    if probe.code != 0 {
        eprintln!(
            "SKIP: unshare -pmf does not work here: {}",
            probe.stderr.trim()
        );
        return;
    }
    let (prefix, p) = private_tmp_prefix(&[&shim(), &heap_fixture()]);
    let script = format!(
        "{prefix}exec env LD_PRELOAD={} MEMSHIM_DIRTY_DECAY_MS=-1 {}",
        p[0], p[1]
    );
    let mut ns = Cmd::new("unshare", ["-pmf", "--mount-proc", "sh", "-c", &script]).spawn();
    let line = ns.wait_for_line("started", Duration::from_secs(10));
    assert_eq!(line, "started 1", "the fixture is pid 1 of its namespace");
    let unshare_pid = ns.pid();
    let host_pid: i32 = wait_until(Duration::from_secs(5), || {
        let rd = std::fs::read_dir(format!("/proc/{unshare_pid}/task")).ok()?;
        rd.flatten().find_map(|t| {
            std::fs::read_to_string(t.path().join("children"))
                .ok()?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
    })
    .expect("the namespaced process");
    let nspid = std::fs::read_to_string(format!("/proc/{host_pid}/status")).unwrap();
    assert!(
        nspid
            .lines()
            .any(|l| l.starts_with("NSpid:") && l.ends_with("\t1")),
        "{nspid}"
    );

    // Its socket lives in its private /tmp, invisible at the host's path.
    let inside = format!("/tmp/memshim-0/1-{}.sock", starttime(host_pid));
    wait_until(Duration::from_secs(10), || {
        std::path::Path::new(&format!("/proc/{host_pid}/root{inside}"))
            .exists()
            .then_some(())
    })
    .expect("socket inside the namespace");
    assert!(
        !std::path::Path::new(&inside).exists(),
        "the namespace's /tmp should be private"
    );

    ns.send("alloc 64");
    ns.wait_for_line("ready", Duration::from_secs(30));
    let (code, s) = ctl_json(&["stats", &host_pid.to_string()]);
    assert_eq!(code, 0, "{s}");
    assert_eq!(s["pid"], 1, "the process reports its own pid");
    assert!(s["allocator"]["dirty"].as_u64().unwrap() > 16 << 20, "{s}");
    let (code, list) = ctl_json(&["list"]);
    assert_eq!(code, 0);
    let me = list["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == host_pid)
        .cloned()
        .expect("listed");
    assert_eq!(
        (me["nspid"].as_i64(), me["endpoint"].as_bool()),
        (Some(1), Some(true)),
        "{me}"
    );
    let (code, p) = ctl_json(&["purge", &host_pid.to_string()]);
    assert_eq!(code, 0, "{p}");
    assert!(
        p["purge"][0]["result"]["released"].as_u64().unwrap() > 16 << 20,
        "{p}"
    );
    ns.send("quit");
    let out = ns.finish(Duration::from_secs(10));
    assert_eq!((out.code, out.stderr.as_str()), (0, ""));
}
