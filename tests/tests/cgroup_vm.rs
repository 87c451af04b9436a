//! The cgroup tests on a live cgroup v2 kernel: this machine has the v1
//! memory controller, so the same test executables that cargo built run
//! again inside VMs (memshim_tests::vm; tests/vm/README.md) that boot
//! Debian's kernels with cgroup2 mounted and nothing else: there
//! `cgroups::hierarchy()` finds v2. Each configuration is one VM: a kernel
//! (Debian 12's 6.1, and the newest Debian kernel that boots here) times a
//! transparent huge page mode (`madvise`, Debian's default, and `always`,
//! under which a process's heap grows in 2 MiB steps).
//!
//! A configuration passes when every test in it passes; what ran, and for
//! how long, is reported on stderr. The last test is not a cgroup's: it
//! checks the ptrace road's Yama refusals against a kernel that has Yama. It says SKIP where QEMU or its kernel
//! cannot be had (scripts/vm-image.sh wrote why).

use memshim_tests::vm::{self, Kernel, Thp, Vm};
use memshim_tests::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The cgroup test modules that run on cgroup v2 in the VMs: the one
/// list to change when tests move. Where `tests/tests/cgroup/main.rs`
/// exists they are modules of one test executable, `cgroup` (run with the
/// filter `<module>::`); before, each was an executable of its own,
/// `cgroup_<module>` ([`guest_tests`] tells which from the sources).
const MODULES: &[&str] = &["pressure", "charge", "errors", "resize"];

/// What one configuration runs: every module, or the pressure tests alone
/// (the THP and kernel cells: what huge pages and an older kernel change
/// is how the working set and PSI behave under pressure; `charge`,
/// `errors` and `resize` read files whose format depends on neither).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Set {
    All,
    Pressure,
}

/// Tests (libtest filters) that run only in the cell of every module: the
/// A/B scenario under `memory.high` runs it twice, once throttled (about
/// 40 s under emulation), and neither THP nor the kernel changes it.
const FULL_CELL_ONLY: &[&str] = &["under_memory_high"];

/// The test executables and libtest arguments of `set`: (executable's
/// target name, filters and `--skip`s).
fn guest_tests(set: Set) -> Vec<(String, Vec<String>)> {
    let modules: Vec<&str> = match set {
        Set::All => MODULES.to_vec(),
        Set::Pressure => vec!["pressure"],
    };
    let skips: Vec<String> = match set {
        Set::All => vec![],
        Set::Pressure => FULL_CELL_ONLY
            .iter()
            .flat_map(|t| ["--skip".to_owned(), (*t).to_owned()])
            .collect(),
    };
    if root().join("tests/tests/cgroup/main.rs").exists() {
        let mut args: Vec<String> = if set == Set::All {
            vec![]
        } else {
            modules.iter().map(|m| format!("{m}::")).collect()
        };
        args.extend(skips);
        vec![("cgroup".to_owned(), args)]
    } else {
        modules
            .iter()
            .map(|m| (format!("cgroup_{m}"), skips.clone()))
            .collect()
    }
}

/// Virtual CPUs and memory of each VM. One CPU: under emulation a second
/// costs a host core (CI has two), and the tests do not need one.
const VCPUS: u32 = 1;
const MEM_MIB: u32 = 1536;

/// One test executable's run inside a VM at most (it is killed then and
/// its configuration fails), and the VM's, boot included.
const EXE_TIMEOUT_S: u64 = 600;
const VM_TIMEOUT: Duration = Duration::from_secs(900);

/// Says `msg` on this process's stderr, uncaptured: the figures of each
/// configuration belong in `make test`'s log whether it passes or not.
fn say(msg: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{msg}");
}

/// The executable cargo built for the test target `name`: the newest
/// `<name>-<hash>` beside this test's own executable.
fn test_executable(name: &str) -> Option<PathBuf> {
    let me = std::env::current_exe().ok()?;
    let deps = me.parent()?;
    std::fs::read_dir(deps)
        .ok()?
        .flatten()
        .filter(|e| {
            let f = e.file_name();
            let f = f.to_string_lossy();
            f.strip_prefix(name)
                .and_then(|r| r.strip_prefix('-'))
                .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max()
        .map(|(_, p)| p)
}

/// A shell script for the VM that runs each executable in turn and marks
/// where each one's output begins and ends.
fn script(exes: &[(String, Vec<String>, PathBuf)]) -> String {
    let q = |a: &str| format!("'{}'", a.replace('\'', "'\\''"));
    let mut s = String::from("ms_now() { cut -d' ' -f1 /proc/uptime; }\n");
    for (name, filters, exe) in exes {
        let filters: Vec<String> = filters.iter().map(|f| q(f)).collect();
        s += &format!(
            "echo '@@@ begin {name}'; t0=$(ms_now); \
             timeout -k 10 {EXE_TIMEOUT_S} {} --test-threads=1 --show-output {} 2>&1; rc=$?; \
             echo \"@@@ end {name} exit=$rc start=$t0 stop=$(ms_now)\"\n",
            q(&exe.display().to_string()),
            filters.join(" ")
        );
    }
    s
}

/// What one executable did in the VM.
#[derive(Debug)]
struct ExeRun {
    name: String,
    exit: i32,
    secs: f64,
    passed: Vec<String>,
    failed: Vec<String>,
    ignored: usize,
    /// Tests that passed by saying SKIP (and returning): (test, its line).
    skipped: Vec<(String, String)>,
    /// What the tests that passed printed (measurements): (test, line).
    notes: Vec<(String, String)>,
    output: String,
}

fn parse(stdout: &str) -> Vec<ExeRun> {
    let mut runs = vec![];
    let mut cur: Option<ExeRun> = None;
    // The test whose captured output is being read (`--show-output`:
    // "---- <test> stdout ----" heads each).
    let mut section: Option<String> = None;
    for line in stdout.lines() {
        if let Some(name) = line.strip_prefix("@@@ begin ") {
            cur = Some(ExeRun {
                name: name.to_owned(),
                exit: -1,
                secs: 0.0,
                passed: vec![],
                failed: vec![],
                ignored: 0,
                skipped: vec![],
                notes: vec![],
                output: String::new(),
            });
            section = None;
        } else if let Some(rest) = line.strip_prefix("@@@ end ") {
            let Some(mut r) = cur.take() else { continue };
            let field = |k: &str| {
                rest.split_whitespace()
                    .find_map(|w| w.strip_prefix(k)?.strip_prefix('='))
                    .unwrap_or("")
            };
            r.exit = field("exit").parse().unwrap_or(-1);
            r.secs = field("stop").parse::<f64>().unwrap_or(0.0)
                - field("start").parse::<f64>().unwrap_or(0.0);
            runs.push(r);
        } else if let Some(r) = cur.as_mut() {
            r.output += line;
            r.output += "\n";
            if let Some(t) = line
                .strip_prefix("---- ")
                .and_then(|l| l.strip_suffix(" stdout ----"))
            {
                section = Some(t.to_owned());
            } else if line == "successes:" || line == "failures:" {
                section = None;
            } else if let Some(t) = &section
                && line.trim_start().starts_with("SKIP")
            {
                r.skipped.push((t.clone(), line.trim().to_owned()));
            } else if let Some(t) = &section
                && !line.trim().is_empty()
                && !r.failed.contains(t)
            {
                r.notes.push((t.clone(), line.trim().to_owned()));
            }
            // libtest: "test <name> ... ok|FAILED|ignored"
            if let Some((name, result)) = line
                .strip_prefix("test ")
                .and_then(|l| l.rsplit_once(" ... "))
            {
                match result.trim() {
                    "ok" => r.passed.push(name.to_owned()),
                    "FAILED" => r.failed.push(name.to_owned()),
                    s if s.starts_with("ignored") => r.ignored += 1,
                    _ => {}
                }
            }
        }
    }
    runs
}

/// How the tests' processes see their cgroup.
#[derive(Clone, Copy, Debug, PartialEq)]
enum View {
    /// The host's: cgroup2 read-write at /sys/fs/cgroup, the initial
    /// cgroup and pid namespaces.
    Host,
    /// A pod's: every process the tests start in a test cgroup gets a
    /// cgroup namespace rooted there, cgroup2 mounted read-only, a pid
    /// namespace (`cgroups::CONTAINER_VIEW_ENV`).
    Container,
}

/// Runs the `set` of cgroup tests in a VM booting the kernel of `role`
/// with `thp`, the tests' processes seeing their cgroup as `view` shows it.
fn configuration(role: &str, thp: Thp, view: View, set: Set) {
    let label = format!(
        "{role} thp={}{} {set:?}",
        thp.as_str(),
        if view == View::Container {
            " container-view"
        } else {
            ""
        }
    );
    let kernel: Kernel = match vm::kernel(role) {
        Ok(k) => k,
        Err(why) => {
            say(&format!("SKIP: {label}: {why}"));
            return;
        }
    };
    let mut exes = vec![];
    for (name, filters) in guest_tests(set) {
        let exe = test_executable(&name).unwrap_or_else(|| {
            panic!(
                "no test executable {name}-<hash> beside this one: build with `cargo test --no-run`"
            )
        });
        // Built before its source last changed: `cargo test --test cgroup_vm`
        // alone does not build the others.
        let tests = root().join("tests/tests");
        let mut srcs = vec![tests.join(format!("{name}.rs"))];
        srcs.extend(
            std::fs::read_dir(tests.join(&name))
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path()),
        );
        let mtime = |p: &Path| p.metadata().and_then(|m| m.modified()).ok();
        for src in &srcs {
            let (Some(s), Some(e)) = (mtime(src), mtime(&exe)) else {
                continue;
            };
            assert!(
                e >= s,
                "{} is older than {}: build it (`cargo test --release -p memshim-tests --no-run`)",
                exe.display(),
                src.display()
            );
        }
        exes.push((name, filters, exe));
    }
    let mut vm = Vm::new(kernel.clone(), VCPUS, MEM_MIB, thp);
    vm.scratch_seed = vm::compiled_fixtures();
    let python = python();
    // The real CPython (a pyenv shim would look for its own settings).
    let mut env = vec![("MEMSHIM_TEST_PYTHON", python.to_str().unwrap())];
    if view == View::Container {
        env.push((cgroups::CONTAINER_VIEW_ENV, "1"));
    }
    let o = vm.run(&["/bin/sh", "-c", &script(&exes)], &env, VM_TIMEOUT);
    let runs = parse(&o.stdout);
    let mut report = format!(
        "cgroup_vm: {label}: {} ({}), {} {VCPUS} vCPUs {MEM_MIB} MiB: boot {:.1} s, tests {:.1} s",
        kernel.version, kernel.suite, o.accel, o.boot_s, o.run_s
    );
    for r in &runs {
        report += &format!(
            "\n  {:<16} {:>3} passed {:>2} failed {:>2} ignored  {:>6.1} s  exit {}",
            r.name,
            r.passed.len(),
            r.failed.len(),
            r.ignored,
            r.secs,
            r.exit
        );
        for f in &r.failed {
            report += &format!("\n      FAILED {f}");
        }
        for (t, why) in &r.skipped {
            report += &format!("\n      passed by skipping: {t}: {why}");
        }
        for (t, line) in &r.notes {
            report += &format!("\n      {t}: {line}");
        }
    }
    say(&report);

    let ran: Vec<&str> = runs.iter().map(|r| r.name.as_str()).collect();
    let missing: Vec<&String> = exes
        .iter()
        .map(|(n, _, _)| n)
        .filter(|n| !ran.contains(&n.as_str()))
        .collect();
    let bad: Vec<&ExeRun> = runs
        .iter()
        .filter(|r| r.exit != 0 || !r.failed.is_empty() || r.passed.is_empty())
        .collect();
    if o.code != 0 || !missing.is_empty() || !bad.is_empty() {
        let mut msg = format!(
            "{label}: the cgroup tests failed on cgroup v2 (VM exit {}, not run: {missing:?})\n{report}\n",
            o.code
        );
        for r in &bad {
            msg += &format!(
                "\n===== {} (exit {}{}) =====\n{}",
                r.name,
                r.exit,
                if r.passed.is_empty() && r.failed.is_empty() {
                    ", no test ran"
                } else {
                    ""
                },
                r.output
            );
        }
        if !o.stderr.is_empty() {
            msg += &format!("\n===== stderr of the VM's command =====\n{}", o.stderr);
        }
        msg += &format!(
            "\n===== the VM's console (warnings, OOM kills) =====\n{}",
            vm::tail(&o.console, 80)
        );
        panic!("{msg}");
    }
}

// The matrix (tests/vm/README.md says why these cells run these sets):
// every module on the newest kernel with Debian's THP default; the
// pressure tests with THP `always`, on Debian 12's kernel, and as a pod
// sees its cgroup. Two cells run at once (`make test`'s two test threads;
// each VM has one vCPU, so each has a host core: two at once took 349 s
// where one at a time took 632 s, each cell as fast as alone). libtest
// starts tests in name order, so the longest cell's name sorts first:
// the others fill the second thread while it runs.

#[test]
fn all_modules_on_the_newest_kernel_thp_madvise() {
    configuration("newest", Thp::Madvise, View::Host, Set::All);
}

#[test]
fn newest_kernel_thp_always_pressure() {
    configuration("newest", Thp::Always, View::Host, Set::Pressure);
}

#[test]
fn newest_kernel_container_view_pressure() {
    configuration("newest", Thp::Madvise, View::Container, Set::Pressure);
}

#[test]
fn bookworm_kernel_thp_madvise_pressure() {
    configuration("bookworm", Thp::Madvise, View::Host, Set::Pressure);
}

#[test]
fn bookworm_kernel_thp_always_pressure() {
    configuration("bookworm", Thp::Always, View::Host, Set::Pressure);
}

/// Debian 12's kernel, else the newest; `None`, said as SKIP, without
/// either (the tests of the harness and of Yama need any one kernel).
fn one_kernel() -> Option<Kernel> {
    match vm::kernel("bookworm").or_else(|_| vm::kernel("newest")) {
        Ok(k) => Some(k),
        Err(why) => {
            say(&format!("SKIP: {why}"));
            None
        }
    }
}

#[test]
fn the_vm_runs_a_command_on_cgroup_v2_and_reports_its_status_and_output() {
    let Some(kernel) = one_kernel() else {
        return;
    };
    let vm = Vm::new(kernel.clone(), 1, 512, Thp::Always);
    let scratch = scratch();
    let o = vm.run(
        &[
            "/bin/sh",
            "-c",
            "uname -r; stat -fc %T /sys/fs/cgroup \"$1\"; cat /sys/fs/cgroup/cgroup.subtree_control \
             /sys/kernel/mm/transparent_hugepage/enabled; echo \"$MEMSHIM_VM_PROBE\"; \
             touch \"$1/x\" /tmp/x /root/x && echo to-stderr >&2; exit 7",
            "sh",
            scratch.to_str().unwrap(),
        ],
        &[("MEMSHIM_VM_PROBE", "a value")],
        Duration::from_secs(300),
    );
    say(&format!(
        "vm: {} booted in {:.1} s ({}), ran {:.1} s",
        kernel.version, o.boot_s, o.accel, o.run_s
    ));
    assert_eq!(o.code, 7, "{o:?}");
    assert_eq!(o.stderr, "to-stderr\n", "{o:?}");
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(
        lines,
        [
            kernel.version.as_str(),
            "cgroup2fs",
            "ext2/ext3",
            "cpuset cpu memory",
            "[always] madvise never",
            "a value"
        ],
        "{o:?}"
    );
    // Nothing the VM wrote is here.
    assert!(!Path::new(&scratch).join("x").exists());
}

// --- Not cgroups: what else needs the VM's kernel ------------------------------

/// Yama, which this machine's kernel lacks and Debian's has: for each
/// `ptrace_scope`, memshim-ctl's ptrace road (docs/attach.md) refuses
/// exactly where the kernel itself refuses (`PTRACE_SEIZE` from the same
/// uid and from root), with `yama`'s exit code, and serves where it
/// allows; the target, a CPython of uid 65534 started without the
/// preload, is left running and untraced (tests/vm/ptrace_scope.sh).
#[test]
fn yama_ptrace_scope_refusals_match_the_kernel() {
    let Some(kernel) = one_kernel() else {
        return;
    };
    let vm = Vm::new(kernel.clone(), 1, 512, Thp::Madvise);
    let script = root().join("tests/vm/ptrace_scope.sh");
    let o = vm.run(
        &["/bin/sh", script.to_str().unwrap(), ctl().to_str().unwrap()],
        &[],
        Duration::from_secs(600),
    );
    say(&format!(
        "yama: {} booted in {:.1} s, ran {:.1} s:\n{}",
        kernel.version, o.boot_s, o.run_s, o.stdout
    ));
    assert_eq!(o.code, 0, "{o:?}");
    if o.stdout.trim() == "no-yama" {
        panic!(
            "Debian's kernel {} has no writable Yama ptrace_scope",
            kernel.version
        );
    }
    let yama = i32::from(memshim_proto::exit::YAMA.code);
    let mut tries = 0;
    for line in o.stdout.lines().filter_map(|l| l.strip_prefix("try ")) {
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(k)?.strip_prefix('='))
                .unwrap_or_else(|| panic!("no {k} in {line:?}"))
        };
        let scope: u32 = field("scope").parse().unwrap();
        let root_caller = field("as") == "root";
        // What Yama allows a caller that is not the target's ancestor: any
        // at 0, one with CAP_SYS_PTRACE at 1 and 2, none at 3.
        let allowed = scope == 0 || (root_caller && scope < 3);
        let kernel_errno: i32 = field("kernel").parse().unwrap();
        assert_eq!(
            kernel_errno == 0,
            allowed,
            "the kernel's own answer: {line}"
        );
        let ctl_code: i32 = field("ctl").parse().unwrap();
        assert_eq!(ctl_code, if allowed { 0 } else { yama }, "{line}\n{o:?}");
        assert_eq!(field("reached"), if allowed { "1" } else { "0" }, "{line}");
        assert_eq!(field("tracer"), "0", "{line}");
        tries += 1;
    }
    assert_eq!(tries, 8, "{o:?}");
    assert!(o.stdout.contains("target alive=1 tracer=0"), "{o:?}");
    assert!(o.stderr.contains("ptrace_scope is 3"), "{o:?}");
}
