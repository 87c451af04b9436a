//! Real programs behave exactly as without the shim: same exit code, same
//! stdout, empty stderr (the first rule of the brief).

use memshim_tests::{Cmd, Output, python, scratch};
use std::path::{Path, PathBuf};

/// Runs `make(shimmed)` both ways and checks the outcomes are identical
/// and clean. Returns the shimmed output.
fn same_both_ways(what: &str, make: impl Fn(bool) -> Cmd) -> Output {
    let plain = make(false).run();
    let shimmed = make(true).shimmed().run();
    assert_eq!(
        plain.code, 0,
        "{what} fails even without the shim: {plain:?}"
    );
    assert_eq!(
        plain.stderr, "",
        "{what} writes to stderr without the shim: {plain:?}"
    );
    assert_eq!(
        (
            shimmed.code,
            shimmed.stdout.as_str(),
            shimmed.stderr.as_str()
        ),
        (plain.code, plain.stdout.as_str(), ""),
        "{what} differs under the shim"
    );
    assert!(
        !shimmed.stdout.is_empty(),
        "{what} printed nothing: the comparison proves little"
    );
    shimmed
}

fn fresh_dir(name: &str) -> PathBuf {
    let d = scratch().join("programs").join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn bash_pipelines_behave_the_same() {
    let script = r#"
        seq 1 20000 | sort -rn | awk '{ s += $1 } END { print s }' | tr 0-9 a-j
        printf '%s\n' {1..3000} | sed 's/1/one/g' | sort | uniq -c | sort -k1,1n -k2 | tail -n 3
        x=""; for i in $(seq 1 2000); do x="$x$i,"; done; echo "${#x}"
        declare -A m; for i in $(seq 1 500); do m[k$i]=$((i * i)); done; echo "${m[k321]} ${#m[@]}"
        echo hello | cat | cat | wc -c
    "#;
    same_both_ways("bash", |_| Cmd::new("bash", ["-c", script]));
}

#[test]
fn python_with_json_sqlite3_and_ssl_behaves_the_same() {
    let script = r#"
import json, sqlite3, ssl, hashlib, zlib
data = {"k%d" % i: [i, str(i) * (i % 7), {"x": i / 3}] for i in range(20000)}
s = json.dumps(data, sort_keys=True)
assert json.loads(s) == data
print(len(s), hashlib.sha256(s.encode()).hexdigest())
db = sqlite3.connect(":memory:")
db.execute("create table t (a integer, b text)")
db.executemany("insert into t values (?, ?)", ((i, "v" * (i % 50)) for i in range(50000)))
print(db.execute("select count(*), sum(a), sum(length(b)) from t").fetchone())
db.execute("create index i on t(b)")
print(db.execute("select b, count(*) from t group by b order by b limit 3").fetchall())
ctx = ssl.create_default_context()
print(ctx.verify_mode == ssl.CERT_REQUIRED, ctx.check_hostname)
print(len(ssl.RAND_bytes(64)), ssl.OPENSSL_VERSION.split()[0])
print(hashlib.sha512(zlib.compress(s.encode(), 9)).hexdigest()[:32])
"#;
    same_both_ways("python3", |_| Cmd::new(python(), ["-c", script]));
}

fn git(dir: &Path, args: &[&str]) -> Cmd {
    let mut all = vec![
        "-c",
        "user.name=Mem Shim",
        "-c",
        "user.email=memshim@example.invalid",
        "-c",
        "init.defaultBranch=main",
    ];
    all.extend_from_slice(args);
    Cmd::new("git", all)
        .dir(dir)
        .env("HOME", dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_DATE", "2024-01-02T03:04:05Z")
        .env("GIT_COMMITTER_DATE", "2024-01-02T03:04:05Z")
}

#[test]
fn git_init_add_commit_behaves_the_same() {
    let run = |shimmed: bool| -> Output {
        let dir = fresh_dir(if shimmed { "git-shim" } else { "git-plain" });
        for i in 0..200 {
            std::fs::write(
                dir.join(format!("f{i}.txt")),
                format!("file {i}\n").repeat(i + 1),
            )
            .unwrap();
        }
        let mut log = String::new();
        for args in [
            &["init", "-q"][..],
            &["add", "."],
            &["commit", "-q", "-m", "first commit"],
            &["log", "--format=%H %an %s"],
            &["rev-parse", "HEAD^{tree}"],
            &["fsck", "--strict"],
        ] {
            let mut c = git(&dir, args);
            if shimmed {
                c = c.shimmed();
            }
            let o = c.run();
            assert_eq!(
                (o.code, o.stderr.as_str()),
                (0, ""),
                "git {args:?} (shimmed={shimmed}): {o:?}"
            );
            log.push_str(&o.stdout);
        }
        Output {
            code: 0,
            stdout: log,
            stderr: String::new(),
        }
    };
    let plain = run(false);
    let shimmed = run(true);
    assert!(plain.stdout.contains("Mem Shim first commit"), "{plain:?}");
    // Fixed dates and identity: the commit hash itself must be identical.
    assert_eq!(shimmed.stdout, plain.stdout);
}

#[test]
fn gcc_builds_the_same_program() {
    const SRC: &str = r#"
#include <stdio.h>
#include <stdlib.h>
static int cmp(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }
int main(void) {
    int v[1000];
    for (int i = 0; i < 1000; i++) v[i] = (i * 7919) % 1000;
    qsort(v, 1000, sizeof *v, cmp);
    long s = 0;
    for (int i = 0; i < 1000; i++) s += (long)v[i] * i;
    printf("sorted sum %ld\n", s);
    return 0;
}
"#;
    let build = |shimmed: bool| -> (Output, Vec<u8>) {
        let dir = fresh_dir(if shimmed { "gcc-shim" } else { "gcc-plain" });
        std::fs::write(dir.join("prog.c"), SRC).unwrap();
        let mut c = Cmd::new("gcc", ["-O2", "-Wall", "-o", "prog", "prog.c"]).dir(&dir);
        if shimmed {
            c = c.shimmed();
        }
        let o = c.run();
        assert_eq!(
            (o.code, o.stdout.as_str(), o.stderr.as_str()),
            (0, "", ""),
            "gcc (shimmed={shimmed}): {o:?}"
        );
        let mut r = Cmd::new(dir.join("prog"), [""; 0]);
        if shimmed {
            r = r.shimmed();
        }
        (r.run(), std::fs::read(dir.join("prog")).unwrap())
    };
    let (plain, plain_bin) = build(false);
    let (shimmed, shimmed_bin) = build(true);
    assert_eq!(
        (plain.code, plain.stdout.as_str(), plain.stderr.as_str()),
        (0, "sorted sum 332833500\n", "")
    );
    assert_eq!(shimmed, plain);
    // cc1, as and ld all ran under the shim and produced the same bytes.
    assert!(
        plain_bin == shimmed_bin,
        "gcc produced a different executable under the shim"
    );
}

#[test]
fn python_multiprocessing_with_fork_forkserver_and_spawn_behaves_the_same() {
    // Pools fork from a process that has threads (and so the shim's thread).
    let script = r#"
import multiprocessing as mp, concurrent.futures as cf, json
def work(n):
    return sum(len(json.dumps(list(range(i)))) for i in range(n))
if __name__ == "__main__":
    for method in ("fork", "forkserver", "spawn"):
        with mp.get_context(method).Pool(2) as p:
            print(method, p.map(work, [50, 100, 150]))
    with cf.ThreadPoolExecutor(4) as ex:
        print("threads", list(ex.map(work, [10, 20, 30])))
    with cf.ProcessPoolExecutor(2, mp_context=mp.get_context("fork")) as ex:
        print("procs", list(ex.map(work, [10, 20, 30])))
"#;
    let dir = fresh_dir("multiprocessing");
    std::fs::write(dir.join("mp.py"), script).unwrap();
    same_both_ways("python3 multiprocessing", |_| {
        Cmd::new(python(), ["mp.py"]).dir(&dir)
    });
}
