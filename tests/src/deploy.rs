//! Shared by the `deploy` family (tests/tests/deploy/): `make install` into a scratch prefix,
//! a tiny HTTP/1.0 client, and JSON number lookup without a JSON crate.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::root;

/// A fresh, empty directory under target/test-scratch (removed first if a
/// previous run left it).
pub fn fresh_dir(name: &str) -> PathBuf {
    let d = crate::scratch().join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `make <target> VAR=VAL...` in the repository root, as a user would,
/// without the outer make's jobserver settings. Panics with make's output on
/// failure. One at a time in a test process: the deploy tests run side by
/// side in one binary, and two builds at once (`make install` builds the
/// library, `make wheel-<arch>` runs cargo-zigbuild) would share `target/`
/// and cargo-zigbuild's wrapper scripts.
pub fn make(target: &str, vars: &[(&str, &Path)]) {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut c = Command::new("make");
    c.current_dir(root()).arg("-s").arg(target);
    for (k, v) in vars {
        c.arg(format!("{k}={}", v.display()));
    }
    for k in ["MAKEFLAGS", "MFLAGS", "MAKELEVEL", "LD_PRELOAD"] {
        c.env_remove(k);
    }
    let o = c.output().expect("run make");
    assert!(
        o.status.success(),
        "make {target} failed:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Every regular file or link under `dir`, relative to it, sorted.
pub fn files_under(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, d: &Path, out: &mut Vec<String>) {
        let Ok(rd) = std::fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let p = e.path();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                walk(base, &p, out);
            } else {
                out.push(p.strip_prefix(base).unwrap().display().to_string());
            }
        }
    }
    let mut v = vec![];
    walk(dir, dir, &mut v);
    v.sort();
    v
}

/// One HTTP/1.0 request; returns (status, body).
pub fn http(addr: &str, method: &str, path: &str) -> (u16, String) {
    http_with(addr, method, path, &[])
}

/// The number after `"key": ` in a flat JSON object.
pub fn json_num(body: &str, key: &str) -> Option<f64> {
    let pat = format!("\"{key}\":");
    let rest = body[body.find(&pat)? + pat.len()..].trim_start();
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || "-.eE+".contains(c)))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// The raw token after `"key": ` (true/false/"string").
pub fn json_tok<'a>(body: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("\"{key}\":");
    let rest = body[body.find(&pat)? + pat.len()..].trim_start();
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    Some(rest[..end].trim())
}

/// One HTTP/1.0 request with extra headers (a `Host` given here replaces
/// the default one); returns (status, body).
pub fn http_with(addr: &str, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.0\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req += &format!("Host: {addr}\r\n");
    }
    for (k, v) in headers {
        req += &format!("{k}: {v}\r\n");
    }
    req += "Content-Length: 0\r\n\r\n";
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, body.to_owned())
}
