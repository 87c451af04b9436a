//! The headline: a multi-threaded process that frees a large heap and then
//! makes no further allocation gets its RSS back within seconds, by the
//! shim's own thread (jemalloc alone decays only on allocator activity).

use memshim_tests::{Child, Cmd, fixture, mib, rss_bytes, scratch, wait_until};
use std::time::{Duration, Instant};

const HEAP_MIB: u64 = 512;
const DEADLINE: Duration = Duration::from_secs(6);
const T: Duration = Duration::from_secs(60);

/// What one run of the idle_heap fixture measured.
struct Figure {
    baseline: u64,
    peak: u64,
    /// RSS above baseline that counts as "returned" (10% of freed + 32 MiB).
    allowed: u64,
    /// Time until RSS was back within `allowed`, if within the deadline.
    returned_after: Option<Duration>,
    /// RSS at that moment, or at the deadline.
    last: u64,
    /// Lowest RSS seen within 3 s of the free (where it settles).
    settled: u64,
}

impl Figure {
    fn freed(&self) -> u64 {
        self.peak.saturating_sub(self.baseline)
    }
    fn describe(&self) -> String {
        format!(
            "baseline {:.0} MiB, peak {:.0} MiB (freed {:.0} MiB), {} -> RSS {:.0} MiB ({:.0} MiB above baseline, limit {:.0}); lowest within 3 s: {:.0} MiB above baseline",
            mib(self.baseline),
            mib(self.peak),
            mib(self.freed()),
            match self.returned_after {
                Some(d) => format!("returned after {:.2} s", d.as_secs_f64()),
                None => format!("NOT returned within {} s", DEADLINE.as_secs()),
            },
            mib(self.last),
            mib(self.last.saturating_sub(self.baseline)),
            mib(self.allowed),
            mib(self.settled.saturating_sub(self.baseline)),
        )
    }
}

fn start(shimmed: bool, envs: &[(&str, &str)]) -> Child {
    let mut c = Cmd::new(fixture("idle_heap", &[]), [HEAP_MIB.to_string()]);
    if shimmed {
        c = c.shimmed();
    }
    for (k, v) in envs {
        c = c.env(k, v);
    }
    let mut ch = c.spawn();
    ch.wait_for_line("ready", T);
    ch
}

/// Drives a started fixture through alloc, free and the idle wait.
fn measure(ch: &mut Child) -> Figure {
    let pid = ch.pid();
    let baseline = rss_bytes(pid);
    ch.send("alloc");
    ch.wait_for_line("allocated", T);
    let peak = rss_bytes(pid);
    assert!(
        peak - baseline > HEAP_MIB * 1024 * 1024 * 8 / 10,
        "the heap was not built: baseline {baseline}, peak {peak}"
    );
    ch.send("free");
    ch.wait_for_line("freed", T);
    let freed_at = Instant::now();
    let allowed = (peak - baseline) / 10 + 32 * 1024 * 1024;
    let mut last = rss_bytes(pid);
    let returned_after = wait_until(DEADLINE, || {
        last = rss_bytes(pid);
        (last.saturating_sub(baseline) <= allowed).then(|| freed_at.elapsed())
    });
    // Where it settles: the lowest RSS within 3 s of the free (stop early
    // once it is within 16 MiB of the baseline).
    let mut settled = last;
    let _ = wait_until(
        Duration::from_secs(3).saturating_sub(freed_at.elapsed()),
        || {
            settled = settled.min(rss_bytes(pid));
            (settled.saturating_sub(baseline) <= 16 * 1024 * 1024).then_some(())
        },
    );
    Figure {
        baseline,
        peak,
        allowed,
        returned_after,
        last,
        settled,
    }
}

#[test]
fn idle_multithreaded_process_returns_freed_heap_within_six_seconds() {
    // Shim and glibc side by side, on the same fixture, at the same time.
    let mut ours = start(true, &[]);
    let mut glibc = start(false, &[]);
    let g = std::thread::spawn(move || {
        let f = measure(&mut glibc);
        let o = glibc.finish(T);
        (f, o)
    });
    let f = measure(&mut ours);
    let o = ours.finish(T);
    let (gf, go) = g.join().unwrap();
    let report = format!(
        "idle return of a {HEAP_MIB} MiB fragmented heap, 4 allocating threads + 1 sleeping, no allocation after free:\n  memshim: {}\n  glibc:   {}\n",
        f.describe(),
        gf.describe()
    );
    eprintln!("{report}");
    std::fs::write(scratch().join("idle_return.txt"), &report).unwrap();
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    assert_eq!((go.code, go.stderr.as_str()), (0, ""), "{go:?}");
    assert!(f.returned_after.is_some(), "{report}");
}

#[test]
fn decay_off_or_no_shim_thread_keeps_the_freed_heap_proving_the_mechanism_is_the_shims() {
    // MEMSHIM_DIRTY_DECAY_MS=-1 turns it off. MEMSHIM_CONTROL=off keeps
    // jemalloc's decay but not the shim's thread: jemalloc alone decays only
    // on allocator activity, so an idle process keeps its pages too.
    let mut off = start(true, &[("MEMSHIM_DIRTY_DECAY_MS", "-1")]);
    let mut no_thread = start(true, &[("MEMSHIM_CONTROL", "off")]);
    let h = std::thread::spawn(move || {
        let f = measure(&mut no_thread);
        (f, no_thread.finish(T))
    });
    let f = measure(&mut off);
    let o = off.finish(T);
    let (nf, no) = h.join().unwrap();
    eprintln!("memshim with MEMSHIM_DIRTY_DECAY_MS=-1: {}", f.describe());
    eprintln!("memshim with MEMSHIM_CONTROL=off:      {}", nf.describe());
    for (what, f, o) in [
        ("MEMSHIM_DIRTY_DECAY_MS=-1", &f, &o),
        ("MEMSHIM_CONTROL=off", &nf, &no),
    ] {
        assert!(
            f.returned_after.is_none(),
            "{what}: RSS came back: {}",
            f.describe()
        );
        // Most of the heap is still resident, not just "a bit above the limit".
        assert!(
            f.settled - f.baseline > f.freed() / 2,
            "{what}: {}",
            f.describe()
        );
        assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{what}: {o:?}");
    }
}
