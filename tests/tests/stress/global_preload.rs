//! Global preload, as a Dockerfile `ENV LD_PRELOAD=...` line does it: a
//! shell started with LD_PRELOAD in its environment runs apt, pip, venv,
//! make + gcc, git, tar, sort and find. Each step gives the same exit code
//! and stdout as without the shim, and an empty stderr.

use memshim_tests::stress::{Level, figures};
use memshim_tests::*;
use std::time::Duration;

fn steps(py: &str, wheel: &str) -> Vec<(&'static str, String)> {
    vec![
        ("apt-cache", "apt-cache policy bash coreutils; apt-cache show hostname | grep -E '^(Package|Priority|Section):'; apt-cache depends make | head -20; apt-cache search --names-only '^coreutils$'".into()),
        // `check` takes dpkg's lock unless told not to: another package manager
        // on the machine (unattended-upgrades on a fresh VM) must not make
        // the run without the shim differ from the run with it.
        ("apt-get", "apt-get -s install hostname; apt-get -s remove --no-act hostname | tail -3; apt-get -o Debug::NoLocking=true check; echo rc=$?".into()),
        (
            "venv+pip",
            format!(
                "set -e; unset PIP_FIND_LINKS; export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PYTHONDONTWRITEBYTECODE=1\n\
                 {py} -m venv v\n{py} {wheel}\nv/bin/pip install -q --no-index --find-links dist tinypkg\n\
                 v/bin/python -c 'import tinypkg, sys; print(tinypkg.hello(), sys.prefix.endswith(\"/v\"))'\n\
                 v/bin/pip list --format=freeze | grep tinypkg\nsha256sum dist/*.whl"
            ),
        ),
        (
            "make+gcc",
            "set -e; mkdir src\n\
             printf '#include <stdio.h>\\n#include <stdlib.h>\\nint add(int a, int b);\\nint main(void) { char *p = malloc(100); snprintf(p, 100, \"%%d\", add(40, 2)); puts(p); free(p); return 0; }\\n' > src/main.c\n\
             printf 'int add(int a, int b) { return a + b; }\\n' > src/add.c\n\
             printf 'app: main.o add.o\\n\\tgcc -o $@ $^\\n%%.o: src/%%.c\\n\\tgcc -O2 -Wall -c -o $@ $<\\n' > Makefile\n\
             make -s -j2 && ./app && make -s -q app; echo up-to-date=$?"
                .into(),
        ),
        (
            "git",
            "set -e; export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@example.invalid GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@example.invalid \
             GIT_AUTHOR_DATE='2024-01-01T00:00:00Z' GIT_COMMITTER_DATE='2024-01-01T00:00:00Z' GIT_CONFIG_NOSYSTEM=1 HOME=$PWD\n\
             git init -q -b main r && cd r\nfor i in $(seq 1 30); do seq $i 1000 > f$i; done\n\
             git add . && git commit -q -m one && git rm -q f1 && git commit -q -m two\n\
             git log --format='%H %s'; git gc -q; git fsck --no-progress 2>&1; git rev-list --count HEAD; git show --stat HEAD | tail -2"
                .into(),
        ),
        (
            "tar",
            "set -e; mkdir -p d/a/b; for i in $(seq 1 200); do seq $i 3000 > d/a/b/f$i; done\n\
             tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -czf t.tgz d && tar -tzf t.tgz | wc -l\n\
             mkdir x && tar -xzf t.tgz -C x && diff -r d x/d && echo same; gzip -dc t.tgz | sha256sum"
                .into(),
        ),
        (
            "sort+find",
            "set -e; seq 1 300000 | awk '{print ($1*7919)%300007}' > n; sort -n n | md5sum; sort -r -S 1M n | head -3; sort -u n | wc -l\n\
             mkdir -p t/a/b/c; for i in $(seq 1 500); do : > t/a/b/c/f$i; done; find t -type f -name 'f1*' | sort | md5sum; find t | wc -l"
                .into(),
        ),
    ]
}

pub fn run(level: Level) {
    let py = python();
    let wheel = root().join("tests/fixtures/make_wheel.py");
    let work = std::path::PathBuf::from(format!("/tmp/msr-gp-{}", std::process::id()));
    let rounds = level.pick(1, 3);
    let mut done = 0;
    for _ in 0..rounds {
        for (name, body) in steps(&py.display().to_string(), &wheel.display().to_string()) {
            let mut outs = vec![];
            for shimmed in [false, true] {
                // The same path both times, so paths in outputs agree.
                let _ = std::fs::remove_dir_all(&work);
                std::fs::create_dir_all(&work).unwrap();
                let mut c = Cmd::new("bash", ["-c", &body]).dir(&work);
                if shimmed {
                    c = c.shimmed();
                }
                outs.push(c.run_timeout(Duration::from_secs(300)));
            }
            let (base, shim) = (&outs[0], &outs[1]);
            assert_eq!(
                base.code, 0,
                "{name} failed without the shim (the test's fault): {base:?}"
            );
            assert_eq!(shim.code, base.code, "{name}: exit code differs: {shim:?}");
            assert_eq!(shim.stdout, base.stdout, "{name}: stdout differs");
            // The shim adds nothing to stderr (a tool's own warning, such
            // as apt's, is the same in both runs).
            assert_eq!(
                shim.stderr, base.stderr,
                "{name}: stderr under the shim differs from without it"
            );
            done += 1;
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    figures(
        level,
        "global_preload",
        &[
            ("steps", done.to_string()),
            (
                "tools",
                "apt-cache,apt-get,venv,pip,make,gcc,git,tar,sort,find".into(),
            ),
            ("failures", "0".into()),
        ],
    );
}
