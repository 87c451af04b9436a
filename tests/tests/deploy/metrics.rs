//! `memshim-ctl metrics` and `memshim-ctl serve`: the exposition checked by
//! `promtool check metrics`, the HTTP server's limits, and a real Prometheus
//! server (Debian's `prometheus`) scraping `serve` every second, seeing a
//! shimmed process's `resident` series fall after `memshim-ctl purge`.
//! The PromQL results before and after go to target/test-scratch/promql.txt.

use memshim_proto::exit::USAGE;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use memshim_tests::deploy::{fresh_dir, http};
use memshim_tests::{Child, Cmd, ctl, proc_status, python, scratch, wait_until};

/// A shimmed CPython that allocates ~200 MB in 4000-byte objects, frees them
/// and waits. Decay is off, so the freed pages stay resident until a purge;
/// the control socket is on although the process is single-threaded.
fn holder() -> Child {
    let code = "import sys\nn = 4000\nb = [b'\\x01' * n for _ in range(50000)]\ndel b\nprint('ready', flush=True)\nsys.stdin.read()\n";
    let mut c = Cmd::new(python(), ["-c", code])
        .shimmed()
        .env("MEMSHIM_CONTROL", "on")
        .env("MEMSHIM_DIRTY_DECAY_MS", "-1")
        .spawn();
    c.wait_for_line("ready", Duration::from_secs(60));
    c
}

/// Waits until `memshim-ctl metrics` lists `pid` (its socket is up).
fn metrics_listing(pid: i32) -> String {
    let tag = format!("memshim_up{{pid=\"{pid}\"");
    wait_until(Duration::from_secs(20), || {
        let o = Cmd::new(ctl(), ["metrics"]).run();
        assert_eq!(
            (o.code, o.stderr.as_str()),
            (0, ""),
            "metrics failed: {o:?}"
        );
        o.stdout
            .lines()
            .any(|l| l.starts_with(&tag) && l.ends_with(" 1"))
            .then_some(o.stdout)
    })
    .unwrap_or_else(|| panic!("pid {pid} never appeared in `memshim-ctl metrics`"))
}

/// The value of the first sample line starting with `prefix`.
fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

fn promtool_check(text: &str) -> (i32, String) {
    let mut c = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let o = c.wait_with_output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

/// `memshim-ctl serve` on a free loopback port; returns it and its address.
fn serve(extra: &[&str]) -> (Child, String) {
    let mut args = vec!["serve", "--listen", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let mut s = Cmd::new(ctl(), args).spawn();
    let line = s.wait_for_line("serving http://", Duration::from_secs(10));
    let addr = line
        .trim_start_matches("serving http://")
        .trim_end_matches("/metrics")
        .to_owned();
    (s, addr)
}

#[test]
fn metrics_describes_a_shimmed_process_and_passes_promtool() {
    let h = holder();
    let pid = h.pid();
    let text = metrics_listing(pid);
    let p = format!("pid=\"{pid}\",command=\"python3");
    for family in [
        "memshim_allocator_bytes",
        "memshim_purgeable_bytes",
        "memshim_resident_bytes",
        "memshim_purges_total",
        "memshim_purge_released_bytes_total",
        "memshim_pressure_purges_total",
        "memshim_pressure_bytes_returned_total",
        "memshim_interposed",
    ] {
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "{family} has no TYPE line:\n{text}"
        );
        assert!(
            text.contains(&format!("{family}{{{p}")),
            "{family} has no sample for pid {pid}:\n{text}"
        );
    }
    // The figures are the process's: RSS matches /proc within 10%, and the
    // freed 200 MB are purgeable.
    let rss = sample(&text, &format!("memshim_resident_bytes{{{p}")).unwrap();
    let proc_rss = (proc_status(pid, "VmRSS").unwrap() * 1024) as f64;
    assert!(
        (rss - proc_rss).abs() < proc_rss / 10.0,
        "metrics say {rss}, /proc says {proc_rss}"
    );
    let purgeable = sample(&text, &format!("memshim_purgeable_bytes{{{p}")).unwrap();
    assert!(purgeable > 150e6, "purgeable {purgeable}");
    assert_eq!(
        sample(&text, &format!("memshim_purges_total{{{p}")),
        Some(0.0)
    );

    if !memshim_tests::have("promtool") {
        eprintln!(
            "SKIP promtool check: promtool is not installed (Debian package prometheus; make test-deps installs it)"
        );
        return;
    }
    let (code, out) = promtool_check(&text);
    assert_eq!(
        (code, out.as_str()),
        (0, ""),
        "promtool check metrics:\n{text}"
    );
    // Live check: promtool does reject a malformed exposition.
    let (code, _) = promtool_check("memshim_resident_bytes 1\n");
    assert_ne!(code, 0);
}

#[test]
fn metrics_reaches_a_process_in_its_own_pid_and_mount_namespace() {
    // What a node exporter does for a container: the process is pid 1 in
    // its own pid namespace with a private /tmp (its socket directory), and
    // is reached from the host through /proc/<pid>/root.
    let (prefix, p) = memshim_tests::private_tmp_prefix(&[&memshim_tests::shim()]);
    let script = format!(
        "{prefix}exec env LD_PRELOAD={} MEMSHIM_CONTROL=on {} -c \
         'import os, sys; print(\"ready\", os.getpid(), flush=True); sys.stdin.read()'",
        p[0],
        python().display()
    );
    let probe = Cmd::new(
        "unshare",
        ["--mount", "--pid", "--fork", "--mount-proc", "true"],
    )
    .run();
    if probe.code != 0 {
        eprintln!(
            "SKIP metrics_reaches_a_process_in_its_own_pid_and_mount_namespace: unshare failed: {}",
            probe.stderr
        );
        return;
    }
    let mut ns = Cmd::new(
        "unshare",
        [
            "--mount",
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child",
            "sh",
            "-c",
            &script,
        ],
    )
    .spawn();
    assert_eq!(
        ns.wait_for_line("ready", Duration::from_secs(60)),
        "ready 1"
    );
    let children =
        std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", ns.pid())).unwrap();
    let host_pid: i32 = children.split_whitespace().next().unwrap().parse().unwrap();
    assert_ne!(host_pid, 1);
    let text = metrics_listing(host_pid);
    assert!(
        text.contains(&format!("memshim_resident_bytes{{pid=\"{host_pid}\"")),
        "{text}"
    );
    // Its socket is not in the host's /tmp: only /proc/<pid>/root leads to it.
    let name = memshim_tests::endpoint::socket_name_inside(1, host_pid).unwrap();
    assert!(Path::new(&format!("/proc/{host_pid}/root/tmp/memshim-0/{name}")).exists());
    assert!(!Path::new(&format!("/tmp/memshim-0/{name}")).exists());
}

#[test]
fn metrics_asks_at_most_max_processes() {
    let (a, b) = (holder(), holder());
    metrics_listing(a.pid());
    metrics_listing(b.pid());
    let o = Cmd::new(ctl(), ["metrics", "--max-processes", "1"]).run();
    assert_eq!(o.code, 0, "{o:?}");
    let found = sample(&o.stdout, "memshim_scrape_processes ").unwrap();
    let skipped = sample(&o.stdout, "memshim_scrape_skipped_processes ").unwrap();
    assert!(found >= 2.0, "{}", o.stdout);
    assert_eq!(skipped, found - 1.0, "{}", o.stdout);
    assert_eq!(
        o.stdout
            .lines()
            .filter(|l| l.starts_with("memshim_up{"))
            .count(),
        1,
        "{}",
        o.stdout
    );
}

#[test]
fn processes_that_do_not_answer_do_not_hide_the_others_from_a_scrape() {
    let light = || {
        let mut c = Cmd::new(
            python(),
            [
                "-c",
                "import sys\nprint('ready', flush=True)\nsys.stdin.read()\n",
            ],
        )
        .shimmed()
        .env("MEMSHIM_CONTROL", "on")
        .spawn();
        c.wait_for_line("ready", Duration::from_secs(60));
        c
    };
    // Started first, so they usually come first in pid order.
    let stuck: Vec<Child> = (0..3).map(|_| light()).collect();
    let fine = light();
    for c in stuck.iter().chain([&fine]) {
        metrics_listing(c.pid());
    }
    let signal = |sig: &str| {
        for c in &stuck {
            assert_eq!(Cmd::new("kill", [sig, &c.pid().to_string()]).run().code, 0);
        }
    };
    // A stopped process's socket accepts, and nothing answers.
    signal("-STOP");
    let o = Cmd::new(
        ctl(),
        ["metrics", "--timeout-ms", "1500", "--deadline-ms", "2500"],
    )
    .run();
    signal("-CONT");
    assert_eq!(o.code, 0, "{o:?}");
    let up = |pid: i32| sample(&o.stdout, &format!("memshim_up{{pid=\"{pid}\""));
    assert_eq!(up(fine.pid()), Some(1.0), "{}", o.stdout);
    for c in &stuck {
        assert_eq!(up(c.pid()), Some(0.0), "{}", o.stdout);
    }
}

#[test]
fn serve_answers_metrics_refuses_the_rest_and_keeps_no_state() {
    let h = holder();
    metrics_listing(h.pid());
    let (s, addr) = serve(&[]);
    let (code, body) = http(&addr, "GET", "/metrics");
    assert_eq!(code, 200);
    assert!(
        body.contains(&format!("memshim_resident_bytes{{pid=\"{}\"", h.pid())),
        "{body}"
    );
    assert_eq!(http(&addr, "GET", "/nope").0, 404);
    assert_eq!(http(&addr, "POST", "/metrics").0, 405);
    let mut c = std::net::TcpStream::connect(&addr).unwrap();
    write!(c, "PUT / HTTP/1.0\r\n\r\n").unwrap();
    let mut resp = String::new();
    let _ = std::io::Read::read_to_string(&mut c, &mut resp);
    assert!(resp.contains("\r\nAllow: GET, HEAD\r\n"), "{resp}");
    assert_eq!(
        http(&addr, "POST", &format!("/purge?pid={}", h.pid())).0,
        404,
        "purge must be off by default"
    );
    // An oversized request head is refused, and the server goes on.
    let mut c = std::net::TcpStream::connect(&addr).unwrap();
    let _ = write!(
        c,
        "GET /metrics HTTP/1.1\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(16 * 1024)
    );
    let mut resp = String::new();
    let _ = std::io::Read::read_to_string(&mut c, &mut resp);
    assert!(resp.starts_with("HTTP/1.1 431"), "{resp:.80}");
    // Memory and descriptors do not grow with scrapes.
    let fds = |pid: i32| {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count()
    };
    for _ in 0..30 {
        assert_eq!(http(&addr, "GET", "/metrics").0, 200);
    }
    let (rss0, fd0) = (proc_status(s.pid(), "VmRSS").unwrap(), fds(s.pid()));
    for _ in 0..300 {
        assert_eq!(http(&addr, "GET", "/metrics").0, 200);
    }
    // A scrape's connection may still be closing: wait for the count.
    let fd1 = wait_until(Duration::from_secs(2), || {
        let n = fds(s.pid());
        (n <= fd0).then_some(n)
    })
    .unwrap_or_else(|| fds(s.pid()));
    let rss1 = proc_status(s.pid(), "VmRSS").unwrap();
    assert_eq!(fd1, fd0, "descriptors grew over 300 scrapes");
    // 4 MiB: glibc's heap in `serve` may grow by its high-water mark when
    // other tests start shimmed processes it then asks; a leak of a
    // response buffer per scrape would pass it.
    assert!(
        rss1 < rss0 + 4096,
        "RSS grew from {rss0} kB to {rss1} kB over 300 scrapes"
    );
}

#[test]
fn serve_is_not_held_by_slow_or_silent_clients() {
    use std::io::Read;
    use std::net::TcpStream;
    use std::time::Instant;
    let (_s, addr) = serve(&[]);
    // Connections that send nothing, more than `serve` serves at once
    // (16): a server that served one connection at a time waited 5 s on each
    // in turn; one that refused connections beyond its limit refused the
    // scrape.
    let silent: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    // A connection gives its slot up once it has waited for its head for
    // HEAD_GRACE (50 ms) (a head on its way keeps it: a burst of clients
    // got their connections closed unanswered).
    std::thread::sleep(Duration::from_millis(1200));
    // A client that sends its request head one byte a second: with a
    // timeout per read, it held the server for a minute.
    let (dripping, started) = std::sync::mpsc::channel();
    let drip = std::thread::spawn({
        let addr = addr.clone();
        move || {
            let mut c = TcpStream::connect(&addr).unwrap();
            let t0 = Instant::now();
            let head = format!("GET /metrics HTTP/1.0\r\nX-Pad: {}\r\n\r\n", "a".repeat(40));
            for b in head.bytes() {
                if c.write_all(&[b]).is_err() || t0.elapsed() > Duration::from_secs(20) {
                    break;
                }
                let _ = dripping.send(());
                // On purpose: the drip is the test.
                std::thread::sleep(Duration::from_secs(1));
            }
            c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            let mut resp = Vec::new();
            let _ = c.read_to_end(&mut resp);
            (t0.elapsed(), String::from_utf8_lossy(&resp).into_owned())
        }
    });
    // Once it is connected and has sent its first byte.
    started
        .recv_timeout(Duration::from_secs(20))
        .expect("the slow client connects");
    let t0 = Instant::now();
    assert_eq!(http(&addr, "GET", "/metrics").0, 200);
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(15),
        "a scrape beside 20 silent connections and a slow one took {took:?}"
    );
    let (took, resp) = drip.join().unwrap();
    // The head's 5 s are counted from the connection, not per read; the
    // answer may be lost to the reset of a connection with unread bytes.
    assert!(
        took < Duration::from_secs(15),
        "the slow client was served for {took:?}: {resp:.80}"
    );
    assert!(
        resp.is_empty() || resp.starts_with("HTTP/1.1 408"),
        "{resp:.80}"
    );
    drop(silent);
}

/// Clients that connect and send nothing, again and again, 25 a second:
/// each took the slot of the oldest silent one, and while every slot's
/// connection was younger than the 1 s grace of before, every scrape got
/// 503. Scrapes among them are answered.
#[test]
fn a_stream_of_silent_connections_does_not_keep_scrapes_out() {
    use std::net::TcpStream;
    use std::sync::atomic::{AtomicBool, Ordering};
    let (_s, addr) = serve(&[]);
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let flood = std::thread::spawn({
        let (addr, stop) = (addr.clone(), stop.clone());
        move || {
            let mut held = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if let Ok(c) = TcpStream::connect(&addr) {
                    held.push(c);
                }
                std::thread::sleep(Duration::from_millis(40));
            }
            held.len()
        }
    });
    // The slots fill with silent connections first.
    std::thread::sleep(Duration::from_millis(1500));
    let codes: Vec<u16> = (0..6)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(250));
            http(&addr, "GET", "/metrics").0
        })
        .collect();
    stop.store(true, Ordering::Relaxed);
    let opened = flood.join().unwrap();
    assert!(opened > 30, "{opened} silent connections");
    assert!(
        codes.iter().all(|&c| c == 200),
        "scrapes among silent clients: {codes:?}"
    );
}

#[test]
fn serve_purge_endpoint_is_loopback_only_and_needs_its_header() {
    let o = Cmd::new(ctl(), ["serve", "--listen", "0.0.0.0:0", "--enable-purge"]).run();
    assert_eq!(o.code, i32::from(USAGE.code), "a usage error: {o:?}");
    // A cap of no process, or no time, would skip everything and still
    // say 0.
    for verb in ["metrics", "serve"] {
        for limit in ["--max-processes", "--timeout-ms", "--deadline-ms"] {
            let o = Cmd::new(ctl(), [verb, limit, "0"]).run();
            assert_eq!(o.code, i32::from(USAGE.code), "{verb} {limit}: {o:?}");
        }
    }
    assert!(o.stderr.contains("loopback"), "{}", o.stderr);
    assert!(
        o.stderr.contains("Usage: memshim-ctl serve"),
        "{}",
        o.stderr
    );

    let h = holder();
    metrics_listing(h.pid());
    let (_s, addr) = serve(&["--enable-purge"]);
    let path = format!("/purge?pid={}", h.pid());
    let (code, body) = http(&addr, "POST", &path);
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("X-Memshim-Purge"), "{body}");
    let before = proc_status(h.pid(), "VmRSS").unwrap();
    let (code, body) =
        memshim_tests::deploy::http_with(&addr, "POST", &path, &[("X-Memshim-Purge", "1")]);
    assert_eq!(code, 200, "{body}");
    let after = proc_status(h.pid(), "VmRSS").unwrap();
    assert!(
        after + 100_000 < before,
        "RSS {before} kB -> {after} kB after the purge"
    );
    // A non-loopback Host (DNS rebinding) is refused even with the header.
    let (code, _) = memshim_tests::deploy::http_with(
        &addr,
        "POST",
        &path,
        &[("X-Memshim-Purge", "1"), ("Host", "evil.example")],
    );
    assert_eq!(code, 403);
    // Two Host lines, the last a loopback one: a bad request (a proxy in
    // front may have read the first), not a purge.
    let (code, body) = memshim_tests::deploy::http_with(
        &addr,
        "POST",
        &path,
        &[
            ("X-Memshim-Purge", "1"),
            ("Host", "evil.example"),
            ("Host", "127.0.0.1"),
        ],
    );
    assert_eq!(code, 400, "{body}");
    // A pid with no such process: 404, as memshim-ctl's `not_found` exit.
    let gone = memshim_tests::deploy::http_with(
        &addr,
        "POST",
        &format!("/purge?pid={}", i32::MAX - 1),
        &[("X-Memshim-Purge", "1")],
    );
    assert_eq!(gone.0, 404, "{}", gone.1);
    assert!(gone.1.contains("no such process"), "{}", gone.1);
    // One pid per request: a second one is refused, not ignored.
    let two = memshim_tests::deploy::http_with(
        &addr,
        "POST",
        &format!("{path}&pid={}", h.pid()),
        &[("X-Memshim-Purge", "1")],
    );
    assert_eq!(two.0, 400, "{}", two.1);
    assert!(two.1.contains("one positive pid"), "{}", two.1);
}

// --- a real Prometheus ---------------------------------------------------------

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Runs an instant query; returns the raw JSON and the first value.
fn query(prom: &str, q: &str) -> (String, Option<f64>) {
    let (code, body) = http(
        prom,
        "GET",
        &format!("/api/v1/query?query={}", urlencode(q)),
    );
    assert_eq!(code, 200, "{q}: {body}");
    let v = body
        .find("\"value\":[")
        .and_then(|i| body[i..].split('"').nth(3))
        .and_then(|v| v.parse().ok());
    (body.trim().to_owned(), v)
}

#[test]
fn prometheus_sees_resident_fall_after_a_purge() {
    if !memshim_tests::have("prometheus") || !memshim_tests::have("promtool") {
        eprintln!(
            "SKIP prometheus_sees_resident_fall_after_a_purge: prometheus/promtool not installed \
             (Debian package prometheus; make test-deps installs it)"
        );
        return;
    }
    let h = holder();
    let pid = h.pid();
    metrics_listing(pid);
    let (_s, target) = serve(&["--deadline-ms", "800"]);

    let dir = fresh_dir("deploy-prometheus");
    let cfg = dir.join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: memshim\n    \
             static_configs:\n      - targets: ['{target}']\n"
        ),
    )
    .unwrap();
    let check = Cmd::new("promtool", ["check", "config", cfg.to_str().unwrap()]).run();
    assert_eq!(check.code, 0, "{check:?}");
    let prom = format!("127.0.0.1:{}", free_port());
    let _p = Cmd::new(
        "prometheus",
        [
            format!("--config.file={}", cfg.display()),
            format!("--storage.tsdb.path={}", dir.join("data").display()),
            format!("--web.listen-address={prom}"),
            "--log.level=warn".into(),
        ],
    )
    .spawn();
    wait_until(Duration::from_secs(60), || {
        std::net::TcpStream::connect(&prom)
            .ok()
            .and_then(|_| (http(&prom, "GET", "/-/ready").0 == 200).then_some(()))
    })
    .expect("prometheus did not become ready");

    let resident = format!("memshim_resident_bytes{{pid=\"{pid}\"}}");
    let dirty = format!("memshim_allocator_bytes{{pid=\"{pid}\",kind=\"dirty\"}}");
    let purges = format!("memshim_purges_total{{pid=\"{pid}\"}}");
    // At least 3 scrapes of the process before the purge...
    wait_until(Duration::from_secs(60), || {
        (query(&prom, &format!("count_over_time({resident}[1m])")).1? >= 3.0).then_some(())
    })
    .expect("prometheus never stored 3 samples of the resident series");
    let (before_json, before) = query(&prom, &resident);
    let before = before.unwrap();
    let (dirty_before_json, _) = query(&prom, &dirty);
    // ... during which it did not fall on its own (decay is off: a fall
    // after the purge is the purge's doing).
    let (_, min) = query(&prom, &format!("min_over_time({resident}[1m])"));
    assert!(
        min.unwrap() > 150e6,
        "resident was already low before the purge: {min:?}"
    );

    let o = Cmd::new(ctl(), ["purge".to_string(), pid.to_string()]).run();
    assert_eq!(o.code, 0, "memshim-ctl purge: {o:?}");

    let after = wait_until(Duration::from_secs(30), || {
        let (json, v) = query(&prom, &resident);
        (v? < before - 100e6).then_some((json, v.unwrap()))
    });
    let Some((after_json, after)) = after else {
        panic!(
            "resident stayed at {:?} in Prometheus after the purge (before {before})",
            query(&prom, &resident).1
        )
    };
    let (dirty_after_json, _) = query(&prom, &dirty);
    let purges_after = wait_until(Duration::from_secs(10), || {
        let (json, v) = query(&prom, &purges);
        (v? >= 1.0).then_some(json)
    })
    .expect("memshim_purges_total did not count the purge");

    let version = Command::new("prometheus")
        .arg("--version")
        .output()
        .unwrap();
    let version = String::from_utf8_lossy(&version.stdout)
        .lines()
        .next()
        .unwrap_or("")
        .to_owned();
    let report = format!(
        "# Prometheus ({version}) scraping `memshim-ctl serve` every 1 s.\n\
         # Process: python3 pid {pid}, shimmed, MEMSHIM_DIRTY_DECAY_MS=-1, ~200 MB of 4000-byte objects freed.\n\
         # GET /api/v1/query?query=...\n\n\
         ## before `memshim-ctl purge {pid}`\n{resident}\n{before_json}\n{dirty}\n{dirty_before_json}\n\n\
         ## after\n{resident}\n{after_json}\n{dirty}\n{dirty_after_json}\n{purges}\n{purges_after}\n\n\
         # resident: {:.1} MiB -> {:.1} MiB\n",
        before / 1048576.0,
        after / 1048576.0
    );
    let out = scratch().join("promql.txt");
    std::fs::write(&out, &report).unwrap();
    eprintln!("{report}(written to {})", out.display());
    assert!(Path::new(&out).exists());
}
