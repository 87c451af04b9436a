//! `make install` / `make uninstall`, and the steps examples/docker/Dockerfile
//! runs, exercised without a Docker engine: install with the Dockerfile's own
//! PREFIX and DESTDIR into a scratch root, then run the example app through
//! the installed paths only.

use std::path::{Path, PathBuf};
use std::time::Duration;

use memshim_tests::deploy::{files_under, fresh_dir, http, json_num, json_tok, make};
use memshim_tests::{Cmd, python, root, rss_bytes, wait_until};

const INSTALLED: [&str; 2] = ["bin/memshim-ctl", "lib/libmemshim.so"];

fn dockerfile() -> String {
    std::fs::read_to_string(root().join("examples/docker/Dockerfile")).unwrap()
}

/// Instructions of the Dockerfile's last stage, continuation lines joined.
fn runtime_stage(df: &str) -> Vec<String> {
    let joined = df.replace("\\\n", " ");
    let ins: Vec<String> = joined
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
    let last_from = ins
        .iter()
        .rposition(|l| l.starts_with("FROM "))
        .expect("a FROM line");
    ins[last_from..].to_vec()
}

/// `(PREFIX, DESTDIR)` of the Dockerfile's `make install` step.
fn dockerfile_install_vars(df: &str) -> (String, String) {
    let line = df
        .lines()
        .find(|l| l.starts_with("RUN ") && l.contains("make install"))
        .expect("a `make install` step");
    let var = |k: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("{k}= in {line:?}"))
            .to_owned()
    };
    (var("PREFIX"), var("DESTDIR"))
}

#[test]
fn install_puts_lib_cli_and_docs_under_prefix_and_uninstall_removes_them() {
    let prefix = fresh_dir("deploy-prefix");
    make("install", &[("PREFIX", &prefix)]);
    let files = files_under(&prefix);
    for f in INSTALLED {
        assert!(
            files.contains(&f.to_string()),
            "{f} not installed; got {files:?}"
        );
    }
    assert!(
        files
            .iter()
            .any(|f| f.starts_with("share/doc/memshim/") && f.ends_with(".md")),
        "{files:?}"
    );
    let lib = prefix.join("lib/libmemshim.so");
    // Stripped of debug info, still loadable: /bin/true runs under it cleanly.
    let o = Cmd::new("/bin/true", [""; 0]).env("LD_PRELOAD", &lib).run();
    assert_eq!((o.code, o.stderr.as_str()), (0, ""));

    make("uninstall", &[("PREFIX", &prefix)]);
    assert_eq!(
        files_under(&prefix),
        Vec::<String>::new(),
        "uninstall left files behind"
    );
}

#[test]
fn install_with_destdir_stages_the_prefix_layout_and_uninstall_reverses_it() {
    let dest = fresh_dir("deploy-destdir");
    let prefix = Path::new("/usr/local");
    make("install", &[("PREFIX", prefix), ("DESTDIR", &dest)]);
    let files = files_under(&dest);
    for f in INSTALLED {
        assert!(
            files.contains(&format!("usr/local/{f}")),
            "usr/local/{f} not staged; got {files:?}"
        );
    }
    assert!(
        files.iter().all(|f| f.starts_with("usr/local/")),
        "files outside DESTDIR/PREFIX: {files:?}"
    );
    make("uninstall", &[("PREFIX", prefix), ("DESTDIR", &dest)]);
    assert_eq!(files_under(&dest), Vec::<String>::new());
}

#[test]
fn dockerfile_preloads_only_after_its_last_run_step_and_the_copy_of_the_library() {
    let df = dockerfile();
    let stage = runtime_stage(&df);
    assert!(
        stage[0].starts_with("FROM python:3.11-slim"),
        "runtime stage is {:?}",
        stage[0]
    );
    let env = stage
        .iter()
        .position(|l| l.starts_with("ENV LD_PRELOAD="))
        .expect("ENV LD_PRELOAD in the last stage");
    let last_run = stage
        .iter()
        .rposition(|l| l.starts_with("RUN "))
        .unwrap_or(0);
    let copy_lib = stage
        .iter()
        .position(|l| l.starts_with("COPY --from=build"))
        .expect("COPY --from=build");
    assert!(
        env > last_run && env > copy_lib,
        "ENV LD_PRELOAD must follow every RUN and the COPY: {stage:#?}"
    );
    assert!(
        stage[env + 1..]
            .iter()
            .all(|l| !l.starts_with("RUN ") && !l.starts_with("ONBUILD ")),
        "nothing may run at build time after the ENV line: {stage:#?}"
    );
    // The preloaded path is where `make install PREFIX=... DESTDIR=...` put it
    // and where the COPY puts it.
    let (prefix, destdir) = dockerfile_install_vars(&df);
    assert_eq!(
        stage[env],
        format!("ENV LD_PRELOAD={prefix}/lib/libmemshim.so")
    );
    assert_eq!(
        stage[copy_lib],
        format!("COPY --from=build {destdir}{prefix}/ {prefix}/")
    );
}

struct Installed {
    root: PathBuf,
    prefix: String,
}

impl Installed {
    fn path(&self, rel: &str) -> PathBuf {
        self.root
            .join(format!("{}/{rel}", self.prefix.trim_start_matches('/')))
    }
}

/// The Dockerfile's `make install` step, with its DESTDIR moved into scratch.
fn install_like_the_dockerfile(name: &str) -> Installed {
    let (prefix, _) = dockerfile_install_vars(&dockerfile());
    let root = fresh_dir(name);
    make(
        "install",
        &[("PREFIX", Path::new(&prefix)), ("DESTDIR", &root)],
    );
    Installed { root, prefix }
}

#[test]
fn example_app_loads_and_unloads_a_model_under_the_installed_shim() {
    let inst = install_like_the_dockerfile("deploy-docker-steps");
    let lib = inst.path("lib/libmemshim.so");
    let mut app = Cmd::new(
        python(),
        [
            root().join("examples/docker/app.py").to_str().unwrap(),
            "--port",
            "0",
            "--quiet",
        ],
    )
    .env("LD_PRELOAD", &lib)
    .env("DEMO_LAYERS", "2")
    .spawn();
    // The app imports torch and transformers before it listens: tens of
    // seconds with a cold page cache on a loaded 2-CPU machine (one run
    // timed out at 60 s there).
    let line = app.wait_for_line("listening on", Duration::from_secs(180));
    let addr = line.split_whitespace().nth(2).unwrap().to_owned();
    let pid = app.pid();

    // The installed copy is the one mapped, not the build tree's.
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let lib_s = lib.to_str().unwrap();
    assert!(maps.contains(lib_s), "{lib_s} not mapped");
    assert!(
        !maps.contains("target/release/libmemshim.so"),
        "build tree's shim mapped"
    );

    let (code, body) = http(&addr, "POST", "/load");
    assert_eq!(code, 200, "{body}");
    assert_eq!(json_tok(&body, "shim_mapped"), Some("true"), "{body}");
    let loaded = json_num(&body, "rss_bytes").unwrap() as u64;
    let before = json_num(&body, "rss_before").unwrap() as u64;
    let model = json_num(&body, "model_bytes").unwrap() as u64;
    assert!(
        loaded > before + model / 2,
        "load grew RSS by only {} of {model} bytes: {body}",
        loaded - before
    );

    let (code, body) = http(&addr, "POST", "/unload");
    assert_eq!(code, 200, "{body}");
    assert_eq!(json_tok(&body, "loaded"), Some("false"), "{body}");
    // Dropped model memory goes back to the OS: RSS falls by most of what
    // the load added (jemalloc decay: within seconds).
    let grown = loaded - before;
    let back = wait_until(Duration::from_secs(20), || {
        let r = rss_bytes(pid);
        (r < loaded - grown * 3 / 4).then_some(r)
    });
    assert!(
        back.is_some(),
        "RSS stayed at {} MiB after unload (before load {} MiB, loaded {} MiB)",
        rss_bytes(pid) >> 20,
        before >> 20,
        loaded >> 20
    );

    // Ctrl-C: the app's KeyboardInterrupt handler exits cleanly.
    let k = Cmd::new("kill", ["-INT", &pid.to_string()]).run();
    assert_eq!(k.code, 0);
    let out = app.finish(Duration::from_secs(20));
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(
        out.stderr, "",
        "the app's stderr must stay empty under the shim"
    );
}

#[test]
fn image_build_steps_still_work_if_a_preload_is_inherited() {
    // Images built FROM ours inherit ENV LD_PRELOAD (an ENV line applies
    // to every later RUN step and every image built on top): their
    // compiler and pip steps run shimmed. Show that such steps behave.
    let inst = install_like_the_dockerfile("deploy-inherited");
    let lib = inst.path("lib/libmemshim.so");
    let dir = fresh_dir("deploy-inherited-cc");
    let src = dir.join("hello.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\nint main(void){puts(\"hi\");return 0;}\n",
    )
    .unwrap();
    let exe = dir.join("hello");
    let cc = Cmd::new("cc", [src.to_str().unwrap(), "-o", exe.to_str().unwrap()])
        .env("LD_PRELOAD", &lib)
        .run();
    assert_eq!((cc.code, cc.stderr.as_str()), (0, ""), "cc under the shim");
    let run = Cmd::new(&exe, [""; 0]).env("LD_PRELOAD", &lib).run();
    assert_eq!(
        (run.code, run.stdout.as_str(), run.stderr.as_str()),
        (0, "hi\n", "")
    );
    let pip = Cmd::new(python(), ["-m", "pip", "--version"])
        .env("LD_PRELOAD", &lib)
        .run();
    assert_eq!(
        (pip.code, pip.stderr.as_str()),
        (0, ""),
        "pip under the shim: {pip:?}"
    );
}
