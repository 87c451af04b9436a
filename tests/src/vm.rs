//! Virtual machines for tests that need a kernel this machine does not
//! run: the cgroup tests on a live cgroup v2 kernel (tests/cgroup_vm.rs).
//! How they are made: tests/vm/README.md.
//!
//! A VM boots one of the kernels that `scripts/vm-image.sh` (run by
//! `make test-deps`) keeps in its cache, with this machine's own root file
//! system as its root (read-only over 9p, under a tmpfs overlay: every
//! program, library and build output is at the same path in the VM, and
//! whatever the VM writes is thrown away), a fresh ext4 disk mounted on the
//! tests' scratch directory (target/test-scratch), tmpfs on /tmp, /run and
//! /dev/shm, cgroup2 on /sys/fs/cgroup with the memory, cpu and cpuset
//! controllers enabled, and the transparent huge page mode asked for. Its
//! init (tests/vm/init.c) runs one command and powers off; the command's
//! stdout, stderr and exit status come back through a second 9p share.
//!
//! QEMU uses KVM where it works (probed once per process: this machine's
//! /dev/kvm cannot run a stock kernel), else software emulation (TCG),
//! where code runs 5 to 50 times slower than here.

use crate::root;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The transparent huge page mode of a VM
/// (/sys/kernel/mm/transparent_hugepage/enabled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Thp {
    /// Huge pages for every large enough anonymous mapping.
    Always,
    /// Huge pages only where `madvise(MADV_HUGEPAGE)` asks.
    Madvise,
}

impl Thp {
    /// The word the kernel takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Thp::Always => "always",
            Thp::Madvise => "madvise",
        }
    }
}

/// A kernel from the cache of `scripts/vm-image.sh`.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// What it stands for: `bookworm` (Debian 12's) or `newest` (the newest
    /// Debian kernel that booted here).
    pub role: String,
    /// Its version (`uname -r` in the VM).
    pub version: String,
    /// The Debian suite it came from.
    pub suite: String,
    /// Its directory in the cache: `vmlinux`, `initramfs`.
    pub dir: PathBuf,
}

/// Boots again after a kernel panic before the command ([`Vm::run`]).
const BOOT_RETRIES: u32 = 2;

/// The cache of `scripts/vm-image.sh`: `vm` in [`crate::cache_dir`].
pub fn cache_dir() -> PathBuf {
    crate::cache_dir().join("vm")
}

fn first_line(p: &Path) -> Option<String> {
    let s = std::fs::read_to_string(p).ok()?;
    Some(s.lines().next().unwrap_or("").trim().to_owned())
}

fn on_path(prog: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
}

/// `mkfs.ext4` (e2fsprogs): on `PATH`, else in the sbin directories a
/// user's `PATH` often lacks.
fn mkfs_ext4() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join("mkfs.ext4"))
        .find(|p| p.is_file())
}

/// The kernel of `role`, or why there is none: the reason that
/// `scripts/vm-image.sh` wrote, or what is missing here. Tests print it
/// as their SKIP reason.
pub fn kernel(role: &str) -> Result<Kernel, String> {
    if !on_path("qemu-system-x86_64") {
        return Err(
            "qemu-system-x86_64 is not installed (make test-deps installs qemu-system-x86)".into(),
        );
    }
    if mkfs_ext4().is_none() {
        return Err("mkfs.ext4 is not installed (apt-get install e2fsprogs)".into());
    }
    let cache = cache_dir();
    for skip in ["all.skip", &format!("{role}.skip")] {
        if let Some(why) = first_line(&cache.join(skip)) {
            return Err(format!("no {role} kernel: {why}"));
        }
    }
    let dir = cache.join(role);
    if !dir.join("ready").exists() {
        return Err(format!(
            "no {role} kernel in {}: run scripts/vm-image.sh (make test-deps runs it)",
            cache.display()
        ));
    }
    // An initramfs older than the sources of its init is stale (the
    // script refreshes it, and marks a fresh one by its time).
    let initramfs = dir.join("initramfs");
    let mtime = |p: &Path| p.metadata().and_then(|m| m.modified()).ok();
    let built = mtime(&initramfs);
    for src in ["tests/vm/init.c", "tests/vm/mkinitramfs.py"] {
        if let (Some(b), Some(s)) = (built, mtime(&root().join(src)))
            && s > b
        {
            return Err(format!(
                "{} is older than {src}: run scripts/vm-image.sh to build it again",
                initramfs.display()
            ));
        }
    }
    Ok(Kernel {
        role: role.to_owned(),
        version: first_line(&dir.join("kernel")).unwrap_or_default(),
        suite: first_line(&dir.join("suite")).unwrap_or_default(),
        dir: dir.canonicalize().unwrap_or(dir),
    })
}

/// What the kernel command line holds (the init's settings travel in a
/// file on the share, never here: nothing of this machine's environment
/// is on the command line). `quiet` keeps warnings, OOM kills among them.
/// `no_timer_check`: on a loaded machine an emulated CPU is too slow for
/// the kernel's IO-APIC timer check, which then panics at boot.
pub const KERNEL_CMDLINE: &str = "console=ttyS0 panic=-1 quiet mitigations=off no_timer_check";

/// A virtual machine to run one command in.
#[derive(Debug, Clone)]
pub struct Vm {
    /// The kernel it boots.
    pub kernel: Kernel,
    /// Virtual CPUs.
    pub vcpus: u32,
    /// Memory, MiB.
    pub mem_mib: u32,
    /// The transparent huge page mode.
    pub thp: Thp,
    /// Files put into the VM's scratch directory (on its fresh disk) before
    /// it boots, with their modification times: fixtures compiled here
    /// need not be compiled again under emulation (seconds each).
    pub scratch_seed: Vec<PathBuf>,
}

/// How a command in a VM ended.
#[derive(Debug, Clone)]
pub struct Output {
    /// Its exit code (128 + signal if killed).
    pub code: i32,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
    /// Seconds from starting QEMU until the command started.
    pub boot_s: f64,
    /// Seconds from the command's start until QEMU exited.
    pub run_s: f64,
    /// `kvm` or `tcg`.
    pub accel: &'static str,
    /// The VM's console: the kernel's warnings (OOM kills among them) and
    /// the init's log.
    pub console: String,
}

/// Environment variables that pass from here into the VM's command (with
/// those the caller gives); nothing else of this environment does.
const PASSED_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "LC_ALL",
    "TERM",
    "RUST_BACKTRACE",
];

/// Size of the scratch disk (sparse: only what is written takes room).
const SCRATCH_DISK_MIB: u64 = 4096;

impl Vm {
    /// A VM booting `kernel` with `vcpus` CPUs and `mem_mib` MiB.
    pub fn new(kernel: Kernel, vcpus: u32, mem_mib: u32, thp: Thp) -> Vm {
        Vm {
            kernel,
            vcpus,
            mem_mib,
            thp,
            scratch_seed: vec![],
        }
    }

    /// Boots, runs `cmd` as root with the working directory at the
    /// workspace root and `env` on top of [`PASSED_ENV`], and powers off.
    /// Panics, with the console's end, if the VM does not boot, or does not
    /// power off within `timeout` (boot included).
    ///
    /// A kernel that panics before the command starts (seen once on
    /// Debian's 7.2 kernel under TCG: an int3 of the kernel's own text
    /// patching in `sched_clock_cpu`, 2.8 s into boot) is booted again, at
    /// most [`BOOT_RETRIES`] times, and this says so on stderr: nothing of
    /// the command ran, so nothing it tests is repeated.
    pub fn run(&self, cmd: &[&str], env: &[(&str, &str)], timeout: Duration) -> Output {
        for _ in 0..BOOT_RETRIES {
            if let Some(o) = self.run_once(cmd, env, timeout, false) {
                return o;
            }
        }
        self.run_once(cmd, env, timeout, true)
            .expect("the last boot panics rather than give up")
    }

    fn run_once(
        &self,
        cmd: &[&str],
        env: &[(&str, &str)],
        timeout: Duration,
        last: bool,
    ) -> Option<Output> {
        assert!(!cmd.is_empty(), "Vm::run: no command");
        let dir = run_dir();
        let share = dir.join("share");
        std::fs::create_dir_all(&share).unwrap();
        let scratch = crate::scratch();
        let disk = dir.join("scratch.img");
        let seed = dir.join("seed");
        std::fs::create_dir_all(&seed).unwrap();
        for f in &self.scratch_seed {
            let to = seed.join(f.file_name().unwrap());
            if std::fs::hard_link(f, &to).is_err() {
                let o = Command::new("cp").arg("-p").arg(f).arg(&to).output();
                assert!(
                    o.is_ok_and(|o| o.status.success()),
                    "cp -p {} {}",
                    f.display(),
                    to.display()
                );
            }
        }
        make_disk(&disk, &seed);

        let mut job: Vec<String> = cmd.iter().map(|a| format!("arg={a}")).collect();
        for k in PASSED_ENV {
            if let Some(v) = std::env::var_os(k).filter(|_| !env.iter().any(|(e, _)| e == k)) {
                job.push(format!("env={k}={}", v.to_string_lossy()));
            }
        }
        job.extend(env.iter().map(|(k, v)| format!("env={k}={v}")));
        job.push(format!("cwd={}", root().display()));
        job.push(format!("share={}", share.display()));
        job.push(format!("disk={}", scratch.display()));
        // A fresh /tmp, unless what the VM must see lies under it (a
        // checkout in /tmp): the overlay makes it writable all the same.
        if !root().starts_with("/tmp") && !dir.starts_with("/tmp") {
            job.push("tmpfs=/tmp".into());
        }
        job.push("tmpfs=/run".into());
        job.push("tmpfs=/dev/shm".into());
        // As systemd mounts it.
        job.push("cgroup2=nsdelegate,memory_recursiveprot".into());
        job.push("controllers=+memory +cpu +cpuset".into());
        job.push(format!("thp={}", self.thp.as_str()));
        job.push("hostname=memshim-vm".into());
        let mut bytes = Vec::new();
        for r in &job {
            assert!(!r.contains('\0'), "a NUL in the job: {r:?}");
            bytes.extend_from_slice(r.as_bytes());
            bytes.push(0);
        }
        std::fs::write(share.join("job"), bytes).unwrap();

        let accel = accel(&self.kernel);
        let console = dir.join("console.log");
        let mut q = self.qemu(accel, &share, Some(&disk), &console);
        let start = Instant::now();
        let mut child = q.spawn().expect("start qemu-system-x86_64");
        let mut started: Option<Instant> = None;
        let status = loop {
            if started.is_none() && share.join("started").exists() {
                started = Some(Instant::now());
            }
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > timeout {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the VM ({} {}, {accel}) did not power off within {timeout:?} ({}); its console ends:\n{}\n\
                     its command's stdout so far:\n{}\nstderr so far:\n{}",
                    self.kernel.role,
                    self.kernel.version,
                    match started {
                        Some(t) => format!("booted in {:.1} s", (t - start).as_secs_f64()),
                        None => "it never started the command".into(),
                    },
                    tail(&read(&console), 40),
                    tail(&read(&share.join("stdout")), 60),
                    tail(&read(&share.join("stderr")), 60),
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let end = Instant::now();
        let console_text = read(&console);
        let st = read(&share.join("status"));
        let code = st.lines().next().and_then(|l| {
            let (how, n) = l.split_once(' ')?;
            let n: i32 = n.trim().parse().ok()?;
            Some(if how == "signal" { 128 + n } else { n })
        });
        let Some(code) = code else {
            if started.is_none() && !last && console_text.contains("Kernel panic") {
                eprintln!(
                    "vm: {} {} panicked before the command started; booting again\n{}",
                    self.kernel.role,
                    self.kernel.version,
                    tail(&console_text, 12)
                );
                return None;
            }
            panic!(
                "the VM ({} {}, {accel}) ended (qemu {status}) without the command's status; {}{}\nits console ends:\n{}",
                self.kernel.role,
                self.kernel.version,
                read(&share.join("error")),
                tail(&read(&dir.join("qemu.log")), 10),
                tail(&console_text, 40)
            );
        };
        let boot = started.unwrap_or(end);
        let out = Output {
            code,
            stdout: read(&share.join("stdout")),
            stderr: read(&share.join("stderr")),
            boot_s: (boot - start).as_secs_f64(),
            run_s: (end - boot).as_secs_f64(),
            accel,
            console: console_text,
        };
        if std::env::var_os("MEMSHIM_VM_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        Some(out)
    }

    /// The QEMU command: the host's root and `share` over 9p, `disk` as
    /// /dev/vda, the console into `console`.
    fn qemu(&self, accel: &str, share: &Path, disk: Option<&Path>, console: &Path) -> Command {
        let mut q = Command::new("qemu-system-x86_64");
        q.args([
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-no-reboot",
        ])
        .args(["-machine", "pc", "-monitor", "none"]);
        if accel == "kvm" {
            q.args(["-accel", "kvm", "-cpu", "host"]);
        } else {
            q.args(["-accel", "tcg,thread=multi", "-cpu", "max"]);
        }
        q.arg("-smp")
            .arg(self.vcpus.to_string())
            .arg("-m")
            .arg(self.mem_mib.to_string())
            .arg("-kernel")
            .arg(self.kernel.dir.join("vmlinux"))
            .arg("-initrd")
            .arg(self.kernel.dir.join("initramfs"))
            .args(["-append", KERNEL_CMDLINE])
            .arg("-serial")
            .arg(format!("file:{}", console.display()))
            .args([
                "-fsdev",
                "local,id=hostroot,path=/,readonly=on,security_model=none,multidevs=remap",
                "-device",
                "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
                "-fsdev",
            ])
            .arg(format!(
                "local,id=share,path={},security_model=none",
                qemu_opt(share)
            ))
            .args(["-device", "virtio-9p-pci,fsdev=share,mount_tag=share"]);
        if let Some(d) = disk {
            q.arg("-drive")
                .arg(format!(
                    "file={},if=none,id=scratch,format=raw,cache=unsafe",
                    qemu_opt(d)
                ))
                .args(["-device", "virtio-blk-pci,drive=scratch"]);
        }
        let log = std::fs::File::create(share.parent().unwrap().join("qemu.log")).unwrap();
        q.stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        q
    }
}

/// A path as a QEMU option value (a comma is doubled).
fn qemu_opt(p: &Path) -> String {
    p.display().to_string().replace(',', ",,")
}

fn read(p: &Path) -> String {
    std::fs::read(p)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// The last `n` lines of `s`.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A fresh directory for one VM run, under target/vm/.
fn run_dir() -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = root()
        .join("target/vm")
        .join(format!("{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// An ext4 file system of [`SCRATCH_DISK_MIB`] in the sparse file `p`,
/// holding what `seed` holds (a real block device in the VM: files in
/// tmpfs would be charged as shared memory, and a loop device charges its
/// backing file's pages to the cgroup that writes).
fn make_disk(p: &Path, seed: &Path) {
    let f = std::fs::File::create(p).unwrap();
    f.set_len(SCRATCH_DISK_MIB << 20).unwrap();
    drop(f);
    crate::run_ok(
        Command::new(mkfs_ext4().unwrap_or_else(|| "mkfs.ext4".into()))
            .args(["-q", "-F", "-m", "0", "-L", "memshim-scratch", "-d"])
            .arg(seed)
            .arg(p),
        format_args!("mkfs.ext4 (e2fsprogs) {}", p.display()),
    );
}

/// `kvm` where QEMU can run a kernel with it here, else `tcg`; probed once
/// per process by booting `kernel` to run /bin/true (60 s at most).
/// `MEMSHIM_VM_ACCEL=kvm|tcg` decides instead.
fn accel(kernel: &Kernel) -> &'static str {
    static A: OnceLock<&'static str> = OnceLock::new();
    A.get_or_init(|| {
        match std::env::var("MEMSHIM_VM_ACCEL").as_deref() {
            Ok("kvm") => return "kvm",
            Ok("tcg") => return "tcg",
            _ => {}
        }
        let usable = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .is_ok();
        if !usable {
            return "tcg";
        }
        let vm = Vm::new(kernel.clone(), 1, 256, Thp::Madvise);
        let dir = run_dir();
        let share = dir.join("share");
        std::fs::create_dir_all(&share).unwrap();
        let job: Vec<u8> = ["arg=/bin/true", "env=PATH=/usr/bin:/bin", "cwd=/"]
            .iter()
            .map(|r| r.to_string())
            .chain([format!("share={}", share.display())])
            .flat_map(|r| r.into_bytes().into_iter().chain([0]))
            .collect();
        std::fs::write(share.join("job"), job).unwrap();
        let mut q = vm.qemu("kvm", &share, None, &dir.join("console.log"));
        let t = Instant::now();
        let ok = q.spawn().ok().is_some_and(|mut c| {
            loop {
                if let Ok(Some(_)) = c.try_wait() {
                    break read(&share.join("status")).starts_with("exit 0");
                }
                if t.elapsed() > Duration::from_secs(60) {
                    let _ = c.kill();
                    let _ = c.wait();
                    break false;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let why = tail(&read(&dir.join("qemu.log")), 1);
        let _ = std::fs::remove_dir_all(&dir);
        if ok {
            "kvm"
        } else {
            eprintln!(
                "vm: KVM cannot run the test kernel here ({}); using software emulation (TCG)",
                if why.is_empty() {
                    "it did not boot"
                } else {
                    why.trim()
                }
            );
            "tcg"
        }
    })
}

/// The fixtures that earlier tests compiled into the scratch directory here
/// (`tests/fixtures/<name>.c` made `<name>`, `<name>-<hash>` or
/// `lib<name>[-<hash>].so`), for [`Vm::scratch_seed`]. `fixture()` in the
/// VM compiles again those older than their source.
pub fn compiled_fixtures() -> Vec<PathBuf> {
    let stems: Vec<String> = std::fs::read_dir(root().join("tests/fixtures"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.strip_suffix(".c").map(str::to_owned)
        })
        .collect();
    let is_fixture = |name: &str| {
        let n = name
            .strip_suffix(".so")
            .and_then(|n| n.strip_prefix("lib"))
            .unwrap_or(name);
        let base = match n.rsplit_once('-') {
            Some((b, h)) if !h.is_empty() && h.bytes().all(|c| c.is_ascii_hexdigit()) => b,
            _ => n,
        };
        stems.iter().any(|s| s == base)
    };
    std::fs::read_dir(crate::scratch())
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| is_fixture(&e.file_name().to_string_lossy()))
        .map(|e| e.path())
        .collect()
}
