//! Hostile input: the protocol decoder fed random and mutated lines, and
//! the live socket of a shimmed process fed random bytes, oversized frames,
//! slow clients, 1000 concurrent connections and unknown or code-like
//! requests. The host stays alive, answers afterwards, keeps its threads and
//! a bounded RSS, and runs nothing a client chose.

use memshim_proto::{ErrorCode, Request, parse_request};
use memshim_tests::endpoint::{Conn, socket_path};
use memshim_tests::stress::{Level, Rng, alive, figures, seed};
use memshim_tests::*;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

const VALID: &[&str] = &[
    r#"{"op":"hello","version":1,"client":"x"}"#,
    r#"{"op":"stats","arenas":true,"pss":false}"#,
    r#"{"op":"purge"}"#,
    r#"{"op":"decay","dirty_ms":250,"muzzy_ms":-1}"#,
    r#"{"op":"gc"}"#,
    r#"{"op":"empty_cache"}"#,
    r#"{"op":"release"}"#,
];

/// One hostile line, from the generator state.
fn hostile_line(rng: &mut Rng) -> Vec<u8> {
    match rng.below(8) {
        0 => (0..rng.below(200)).map(|_| rng.next() as u8).collect(),
        1 | 2 => {
            // A valid request with a few bytes flipped, inserted or removed.
            let mut v = VALID[rng.below(VALID.len() as u64) as usize]
                .as_bytes()
                .to_vec();
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(v.len() as u64 + 1) as usize;
                match rng.below(3) {
                    0 if i < v.len() => v[i] = rng.next() as u8,
                    1 => {
                        let pool = b"{}[]\":,\\0-9eE\x00\xff";
                        v.insert(i, pool[rng.below(pool.len() as u64) as usize])
                    }
                    _ if i < v.len() => {
                        v.remove(i);
                    }
                    _ => {}
                }
            }
            v
        }
        3 => {
            let d = 1 + rng.below(3000) as usize;
            let open = if rng.below(2) == 0 { "[" } else { "{\"a\":" };
            format!("{}1", open.repeat(d)).into_bytes()
        }
        4 => format!(
            r#"{{"op":"decay","dirty_ms":{}{}}}"#,
            rng.next() as i64,
            "9".repeat(rng.below(40) as usize)
        )
        .into_bytes(),
        5 => {
            let ops = [
                "exec",
                "eval",
                "system",
                "shell",
                "python",
                "dlopen",
                "__import__('os').system('id')",
                "",
                "STATS",
                "stats\u{0}",
            ];
            format!(
                r#"{{"op":{:?},"code":"import os; os.system('touch /tmp/memshim-pwned')"}}"#,
                ops[rng.below(ops.len() as u64) as usize]
            )
            .into_bytes()
        }
        6 => format!(
            r#"{{"op":"hello","version":{}}}"#,
            [0i64, -1, 1, 2, u32::MAX as i64, i64::MAX][rng.below(6) as usize]
        )
        .into_bytes(),
        _ => {
            let s: String = (0..rng.below(64))
                .map(|_| char::from_u32(rng.below(0x11_0000) as u32).unwrap_or('?'))
                .collect();
            format!(
                r#"{{"op":"stats","arenas":{s:?},"x":[{}]}}"#,
                "1,".repeat(rng.below(100) as usize)
            )
            .into_bytes()
        }
    }
}

pub fn decoder(level: Level) {
    let cases = level.pick(50_000u64, 3_000_000);
    let seed = seed();
    let mut rng = Rng::new(seed);
    let (mut ok, mut errs) = (0u64, 0u64);
    let t0 = Instant::now();
    for i in 0..cases {
        let line = hostile_line(&mut rng);
        match parse_request(&line) {
            Ok(req) => {
                ok += 1;
                // What decodes re-encodes to something that decodes the same.
                let again = serde_json::to_vec(&req).unwrap();
                let back: Request =
                    parse_request(&again).unwrap_or_else(|e| panic!("seed {seed} case {i}: {e:?}"));
                assert_eq!(
                    back,
                    req,
                    "seed {seed} case {i}: {:?}",
                    String::from_utf8_lossy(&line)
                );
            }
            Err(e) => {
                errs += 1;
                assert!(
                    matches!(e.code, ErrorCode::BadRequest | ErrorCode::UnknownOp),
                    "seed {seed} case {i}: {:?} for {:?}",
                    e.code,
                    String::from_utf8_lossy(&line)
                );
                assert!(
                    e.message.len() < 1024,
                    "seed {seed} case {i}: message of {} bytes",
                    e.message.len()
                );
            }
        }
    }
    figures(
        level,
        "fuzz_decoder",
        &[
            ("cases", cases.to_string()),
            ("decoded", ok.to_string()),
            ("rejected", errs.to_string()),
            ("seconds", t0.elapsed().as_secs().to_string()),
            ("seed", seed.to_string()),
            ("failures", "0".into()),
        ],
    );
}

fn connect(path: &std::path::Path) -> std::io::Result<UnixStream> {
    let s = UnixStream::connect(path)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    Ok(s)
}

/// Reads until end of file or the read timeout; returns what came.
fn drain(s: &mut UnixStream) -> Vec<u8> {
    let mut v = vec![];
    let _ = s.read_to_end(&mut v);
    v
}

fn raise_nofile() {
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur = r.rlim_max.min(8192);
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
    }
}

pub fn live_socket(level: Level) {
    raise_nofile();
    let seed = seed();
    let mut rng = Rng::new(seed ^ 0x5EED);
    let dir = memshim_tests::socket_dir_path("fuzz");
    let marker = std::path::Path::new("/tmp/memshim-pwned");
    let _ = std::fs::remove_file(marker);
    let prog = "import threading, time\n\
        threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n\
        junk = [bytearray(4096) for _ in range(2000)]\n\
        print('ready', flush=True)\n\
        time.sleep(3600)";
    let mut child = Cmd::new(python(), ["-c", prog])
        .shimmed()
        .env("MEMSHIM_SOCKET_DIR", &dir)
        .spawn();
    let pid = child.pid();
    child.wait_for_line("ready", Duration::from_secs(30));
    let mut probe = Conn::to_pid(&dir, pid).unwrap_or_else(|e| panic!("{e}"));
    let path = socket_path(&dir, pid).unwrap();
    let threads_before = threads(pid);
    let rss_before = rss_bytes(pid);
    let mut last: Vec<String> = vec![];
    let mut note = |s: String| {
        last.push(s);
        if last.len() > 8 {
            last.remove(0);
        }
    };

    // 1. Random and mutated lines, several per connection, with and without hello.
    let lines = level.pick(3000u64, 200_000);
    let mut conn = connect(&path).unwrap();
    let mut sent = 0u64;
    for i in 0..lines {
        if i % 40 == 0 {
            conn = connect(&path).unwrap();
            if rng.below(2) == 0 {
                conn.write_all(b"{\"op\":\"hello\",\"version\":1}\n")
                    .unwrap();
            }
        }
        let mut l = hostile_line(&mut rng);
        l.retain(|b| *b != b'\n');
        l.push(b'\n');
        note(String::from_utf8_lossy(&l[..l.len().min(200)]).into_owned());
        if conn.write_all(&l).is_err() {
            conn = connect(&path).unwrap();
        }
        sent += 1;
    }
    drop(conn);
    assert!(
        alive(pid),
        "seed {seed}: host {pid} died; last lines: {last:?}"
    );

    // 2. Oversized frames: 70 KB and 8 MiB without a newline.
    let mut oversized = 0;
    for size in [70_000usize, 8 << 20] {
        let mut s = connect(&path).unwrap();
        let t0 = Instant::now();
        let _ = s.write_all(b"{\"op\":\"hello\",\"version\":1}\n");
        let _ = s.write_all(&vec![b'a'; size]);
        let got = String::from_utf8_lossy(&drain(&mut s)).into_owned();
        assert!(
            got.contains("too_large"),
            "seed {seed}: {size}-byte frame got {got:?} after {:?}; threads:{}",
            t0.elapsed(),
            memshim_tests::stress::threads_report(pid)
        );
        oversized += 1;
    }

    // 3. Slowloris: 12 clients dribbling a byte every 100 ms; meanwhile a
    //    normal client is still answered, within a bound.
    let slow = level.pick(12, 14);
    let dribble_for = level.secs(3, 8);
    let mut slows: Vec<UnixStream> = (0..slow).map(|_| connect(&path).unwrap()).collect();
    let t0 = Instant::now();
    let mut answered_during = 0;
    while t0.elapsed() < dribble_for {
        for s in &mut slows {
            let _ = s.write_all(b"{");
        }
        let mut c =
            Conn::open(&path).unwrap_or_else(|e| panic!("seed {seed}: during slowloris: {e}"));
        let v = c.ask(r#"{"op":"stats"}"#).unwrap();
        assert!(v.get("ok").is_some(), "{v}");
        answered_during += 1;
        // On purpose: the dribble's pace, a byte per client every 100 ms.
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(slows);

    // 4. 1000 concurrent connections, each sending hello; at most 16 are
    //    held, the rest are closed (with `busy`); none hangs.
    let n = level.pick(1000, 1000);
    let mut many = vec![];
    for _ in 0..n {
        match connect(&path) {
            Ok(mut s) => {
                let _ = s.write_all(b"{\"op\":\"hello\",\"version\":1}\n");
                many.push(s);
            }
            Err(e) => assert!(
                matches!(
                    e.raw_os_error(),
                    Some(libc::EAGAIN) | Some(libc::ECONNREFUSED)
                ),
                "seed {seed}: connect: {e}"
            ),
        }
    }
    let connected = many.len();
    let (mut hello_ok, mut busy) = (0, 0);
    for s in &mut many {
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut b = [0u8; 512];
        let got = s
            .read(&mut b)
            .map(|k| String::from_utf8_lossy(&b[..k]).into_owned())
            .unwrap_or_default();
        if got.contains("\"hello\"") {
            hello_ok += 1;
        } else if got.contains("busy") {
            busy += 1;
        }
    }
    drop(many);

    // 5. Unknown and code-like requests: refused, nothing runs.
    let mut c = Conn::open(&path).unwrap();
    for op in [
        "frobnicate",
        "exec",
        "eval",
        "system",
        "shell",
        "python",
        "dlopen",
        "__import__('os').system('touch /tmp/memshim-pwned')",
    ] {
        let v = c
            .ask(&format!(
                r#"{{"op":{op:?},"code":"import os; os.system('touch /tmp/memshim-pwned')"}}"#
            ))
            .unwrap();
        assert_eq!(v["error"]["code"], "unknown_op", "{op}: {v}");
    }
    let v = c.ask(r#"{"op":"gc","code":"import os; os.system('touch /tmp/memshim-pwned')","script":"/tmp/x.py"}"#).unwrap();
    assert!(
        v.get("ok").is_some() || v["error"]["code"] == "python_unavailable",
        "{v}"
    );
    assert!(!marker.exists(), "a request ran client-chosen code");

    // The host is fine and answers. The probe, connected first, was
    // evicted in step 4 (it answers "busy" or nothing): a new connection
    // then, as soon as the host has worked through the ones closed above.
    let v = probe
        .ask(r#"{"op":"stats"}"#)
        .ok()
        .filter(|v| v.get("ok").is_some())
        .map_or_else(
            || {
                let mut last = String::new();
                wait_until(Duration::from_secs(10), || {
                    Conn::to_pid(&dir, pid)
                        .and_then(|mut c| c.ask(r#"{"op":"stats"}"#))
                        .map_err(|e| last = e)
                        .ok()
                })
                .ok_or(last)
            },
            Ok,
        )
        .unwrap();
    assert!(v.get("ok").is_some(), "seed {seed}: {v}");
    assert!(alive(pid));
    // The bridge's job thread (a Python host) is joined before each answer,
    // but the kernel counts a thread until it has fully exited: give the
    // count a moment to settle, then require it unchanged.
    let threads_after = wait_until(Duration::from_secs(10), || {
        let n = threads(pid);
        (n == threads_before).then_some(n)
    })
    .unwrap_or_else(|| threads(pid));
    let rss_after = rss_bytes(pid);
    assert_eq!(
        threads_after, threads_before,
        "seed {seed}: thread count changed"
    );
    assert!(
        rss_after < rss_before + (32 << 20),
        "seed {seed}: RSS grew from {} to {} MiB",
        mib(rss_before),
        mib(rss_after)
    );
    let out = {
        drop(child.child.kill());
        child.finish(Duration::from_secs(10))
    };
    assert_eq!(out.stderr, "", "the host wrote to stderr");
    let _ = std::fs::remove_dir_all(&dir);
    figures(
        level,
        "fuzz_live_socket",
        &[
            ("hostile_lines", sent.to_string()),
            ("oversized_frames", oversized.to_string()),
            ("slowloris_clients", slow.to_string()),
            ("answered_during_slowloris", answered_during.to_string()),
            ("concurrent_connections", n.to_string()),
            ("connected", connected.to_string()),
            ("hello_answered", hello_ok.to_string()),
            ("closed_busy", busy.to_string()),
            ("rss_before_mib", format!("{:.1}", mib(rss_before))),
            ("rss_after_mib", format!("{:.1}", mib(rss_after))),
            ("seed", seed.to_string()),
            ("failures", "0".into()),
        ],
    );
}
