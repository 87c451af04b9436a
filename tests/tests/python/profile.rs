//! `memshim-ctl profile` of real CPythons 3.12+ run with `-X perf`: the
//! native profile names the Python function that keeps the memory (from
//! the perf map CPython writes), on pyenv's and Debian sid's interpreters.

use memshim_tests::py::*;
use memshim_tests::{Cmd, ctl};
use std::time::Duration;

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
        let o = Cmd::new(ctl(), ["profile", &pid]).run();
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
