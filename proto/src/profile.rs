//! The `profile` request: jemalloc's heap profiler, switched from outside
//! (docs/profile.md). The shim answers with the live sampled allocations
//! as raw stacks of addresses and the process's executable mappings; the
//! client symbolizes them.

use serde::{Deserialize, Serialize};

/// What a `profile` request does.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum ProfileAction {
    /// Report whether sampling is on; change nothing.
    #[default]
    Status,
    /// Start sampling (`prof.active = true`); nothing if it is on already.
    Start,
    /// Stop sampling (`prof.active = false`); what was sampled stays.
    Stop,
    /// Forget every sample taken so far (`prof.reset`); sampling stays as it is.
    Reset,
    /// The live sampled allocations now ([`HeapDump`]).
    Dump,
}

/// The most seconds sampling started by a `profile` request may last.
pub const MAX_PROFILE_SECONDS: u64 = 86_400;
/// How long sampling started by a `profile` request lasts when the request
/// does not say.
pub const DEFAULT_PROFILE_SECONDS: u64 = 3600;

/// The answer to `profile`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ProfileReply {
    /// Sampling is on (after the action).
    pub active: bool,
    /// This request switched sampling on or off.
    pub changed: bool,
    /// One sample per 2^lg_sample bytes allocated, on average.
    pub lg_sample: u32,
    /// Milliseconds since sampling was last started by a `profile` request,
    /// or since its samples were last reset (`reset`): the window the live
    /// samples were taken in (absent while it is off, or when it was
    /// started otherwise and never reset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_ms: Option<u64>,
    /// Milliseconds until the shim switches off the sampling a `profile`
    /// request started (absent: no deadline, or off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stops_in_ms: Option<u64>,
    /// The live sampled allocations, parsed inside the process (action
    /// `dump` of a shim before `dump_file`; a current shim leaves it out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dump: Option<HeapDump>,
    /// Action `dump`: the file jemalloc's `prof.dump` wrote the profile to,
    /// a name in the directory of the process's socket. The client reads
    /// it, parses it ([`HeapDump::parse`]) and removes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dump_file: Option<String>,
    /// Action `dump`: the build id of each loaded object that has one, read
    /// from the process's own memory (its `NT_GNU_BUILD_ID` note), so the
    /// client knows the file it reads is the one the process mapped
    /// ([`HeapDump::set_build_ids`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub build_ids: Vec<ObjectBuildId>,
    /// Action `dump`: the Python frames that samples' stacks name by id
    /// ([`python_frame_id`]), every one the process has met since sampling
    /// first started.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub python_frames: Vec<PythonFrame>,
}

/// One Python frame as a sample met it: where the thread's code was when
/// it allocated (or called the code that did).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct PythonFrame {
    /// The id the frame's addresses carry.
    pub id: u32,
    /// `co_filename` (a long one keeps its end, after `...`).
    pub file: String,
    /// `co_qualname` (3.11+), `co_name` before.
    pub function: String,
    /// The line the frame was at.
    pub line: u32,
}

/// The top 16 bits of a return address that is a Python frame's: no code
/// address has them (user space ends at 2^47 on x86-64 and 2^48 on
/// AArch64, and these are not a sign extension of either).
const PYTHON_FRAME_TAG: u64 = 0x5059;

/// The address that stands for Python frame `id` in a sample's stack:
/// the id in bits 8 to 47, and 0x80 in the low byte (so the byte before
/// it, where a reader looks up a return address, names the same frame).
pub fn python_frame_address(id: u32) -> u64 {
    (PYTHON_FRAME_TAG << 48) | (u64::from(id) << 8) | 0x80
}

/// The Python frame id an address of a sample's stack stands for, if it
/// is one ([`python_frame_address`]).
pub fn python_frame_id(addr: u64) -> Option<u32> {
    if addr >> 48 != PYTHON_FRAME_TAG {
        return None;
    }
    u32::try_from((addr & 0xffff_ffff_ffff) >> 8).ok()
}

/// The id of the frame that stands for every Python frame a sample met
/// when the process's table of them was full.
pub const PYTHON_FRAME_UNKNOWN: u32 = 0xff_ffff;

/// The build id of one loaded object.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ObjectBuildId {
    /// First address of the object's loaded segments.
    pub start: u64,
    /// One past the last address of its loaded segments.
    pub end: u64,
    /// The build id, in lowercase hex (as `readelf -n` and
    /// `/usr/lib/debug/.build-id` write it).
    pub id: String,
}

/// The live allocations jemalloc sampled, by call stack. Counts are
/// unbiased estimates of all live allocations made while sampling was on
/// (not only the sampled ones): see [`unbias`].
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct HeapDump {
    /// Every distinct return address of the stacks, once.
    pub addrs: Vec<u64>,
    /// One row per distinct call stack with live allocations.
    pub stacks: Vec<HeapStack>,
    /// Estimated live bytes over all stacks.
    pub bytes: u64,
    /// Estimated live allocations over all stacks.
    pub objects: u64,
    /// The process's executable file mappings, to symbolize the addresses.
    pub maps: Vec<Mapping>,
    /// Milliseconds the dump took: jemalloc writing it, and reading and
    /// parsing it.
    pub elapsed_ms: f64,
    /// Stacks left out to keep the answer under [`MAX_DUMP_STACKS`] (the
    /// smallest ones), and their bytes (included in `bytes`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dropped_stacks: u64,
    /// Bytes of the stacks left out.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dropped_bytes: u64,
    /// The Python frames the addresses name ([`python_frame_id`]), as the
    /// answer carried them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub python_frames: Vec<PythonFrame>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// The most stacks one dump sends (the largest by live bytes): with up to
/// 128 frames each, what fits in an answer of `MAX_RESPONSE_BYTES`.
pub const MAX_DUMP_STACKS: usize = 20_000;

/// Live allocations made from one call stack.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct HeapStack {
    /// Estimated live bytes.
    pub bytes: u64,
    /// Estimated live allocations.
    pub objects: u64,
    /// Indexes into [`HeapDump::addrs`], innermost frame first.
    pub frames: Vec<u32>,
}

/// One executable mapping of a file (a line of `/proc/PID/maps`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Offset in the file of `start`.
    pub offset: u64,
    /// The file, as the process sees it.
    pub path: String,
    /// The file's build id in lowercase hex, where the process sent it
    /// (empty: unknown).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub build_id: String,
}

impl HeapDump {
    /// Parses jemalloc's heap profile (`heap_v2/<interval>`, stacks of `@ 0x..`
    /// lines each followed by their `t*:` totals, then `MAPPED_LIBRARIES:`).
    /// Keeps the executable file mappings only. `None` if it is not one.
    pub fn parse(text: &str) -> Option<(u32, HeapDump)> {
        let mut lines = text.lines();
        let head = lines.next()?;
        let interval: u64 = head.strip_prefix("heap_v2/")?.trim().parse().ok()?;
        let lg_sample = 63 - interval.max(1).leading_zeros();
        let mut d = HeapDump::default();
        let mut index = std::collections::HashMap::<u64, u32>::new();
        let mut frames: Option<Vec<u32>> = None;
        let mut in_maps = false;
        for line in lines {
            if in_maps {
                if let Some(m) = parse_map(line) {
                    d.maps.push(m);
                }
            } else if line.starts_with("MAPPED_LIBRARIES:") {
                in_maps = true;
            } else if let Some(rest) = line.strip_prefix('@') {
                let mut f = Vec::new();
                for a in rest.split_whitespace() {
                    let a = u64::from_str_radix(a.trim_start_matches("0x"), 16).ok()?;
                    let next = d.addrs.len() as u32;
                    let i = *index.entry(a).or_insert(next);
                    if i == next {
                        d.addrs.push(a);
                    }
                    f.push(i);
                }
                frames = Some(f);
            } else if let Some(counts) = line.trim_start().strip_prefix("t*:") {
                let (objects, bytes) = unbias(parse_counts(counts)?, interval);
                match frames.take() {
                    Some(frames) if objects > 0 || bytes > 0 => d.stacks.push(HeapStack {
                        bytes,
                        objects,
                        frames,
                    }),
                    Some(_) => {}
                    // The first `t*:` line is the whole profile's.
                    None => {}
                }
            }
        }
        d.bytes = d.stacks.iter().map(|s| s.bytes).sum();
        d.objects = d.stacks.iter().map(|s| s.objects).sum();
        d.keep_largest(MAX_DUMP_STACKS);
        Some((lg_sample, d))
    }

    /// Gives each mapping the build id of the loaded object it lies in.
    pub fn set_build_ids(&mut self, ids: &[ObjectBuildId]) {
        for m in &mut self.maps {
            if let Some(o) = ids.iter().find(|o| o.start <= m.start && m.start < o.end) {
                m.build_id.clone_from(&o.id);
            }
        }
    }

    /// Keeps the `n` stacks with the most live bytes (totals unchanged, the
    /// rest counted in `dropped_*`), and only the addresses they use.
    pub fn keep_largest(&mut self, n: usize) {
        if self.stacks.len() <= n {
            return;
        }
        self.stacks.sort_by_key(|s| core::cmp::Reverse(s.bytes));
        let dropped = self.stacks.split_off(n);
        self.dropped_stacks = dropped.len() as u64;
        self.dropped_bytes = dropped.iter().map(|s| s.bytes).sum();
        let mut remap = std::collections::HashMap::<u32, u32>::new();
        let mut addrs = Vec::new();
        for s in &mut self.stacks {
            for f in &mut s.frames {
                let next = addrs.len() as u32;
                let i = *remap.entry(*f).or_insert(next);
                if i == next {
                    addrs.push(self.addrs[*f as usize]);
                }
                *f = i;
            }
        }
        self.addrs = addrs;
    }
}

/// jemalloc's figures for one stack are the sampled ones, prepared so that
/// pprof's (and jeprof's) correction gives its own unbiased estimate
/// (prof_data.c, "The unbiasing story is long"): with `c` objects of `s`
/// bytes sampled at one per `interval` bytes, both are divided by the
/// chance that an allocation of the average size was sampled,
/// 1 - e^(-(s/c)/interval).
fn unbias((objects, bytes): (u64, u64), interval: u64) -> (u64, u64) {
    if objects == 0 || interval <= 1 {
        return (objects, bytes);
    }
    let avg = bytes as f64 / objects as f64;
    let p = 1.0 - (-avg / interval as f64).exp();
    if p <= 0.0 {
        return (objects, bytes);
    }
    (
        (objects as f64 / p).round() as u64,
        (bytes as f64 / p).round() as u64,
    )
}

/// `" 3: 1572864 [0: 0]"` -> (3, 1572864).
fn parse_counts(s: &str) -> Option<(u64, u64)> {
    let (objects, rest) = s.trim().split_once(':')?;
    let bytes = rest.split_whitespace().next()?;
    Some((objects.trim().parse().ok()?, bytes.parse().ok()?))
}

/// An executable mapping of a file, from one `/proc/PID/maps` line.
fn parse_map(line: &str) -> Option<Mapping> {
    let mut it = line.split_whitespace();
    let range = it.next()?;
    let perms = it.next()?;
    let offset = it.next()?;
    let _dev = it.next()?;
    let _inode = it.next()?;
    let path = it.collect::<Vec<_>>().join(" ");
    if !perms.contains('x') || !path.starts_with('/') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        offset: u64::from_str_radix(offset, 16).ok()?,
        path,
        build_id: String::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Python frame's address says its id, and no code address (nor the
    /// byte before a tagged one, where readers look) is taken for one.
    #[test]
    fn python_frame_addresses_carry_their_id_and_nothing_else_does() {
        for id in [0, 1, 8191, PYTHON_FRAME_UNKNOWN] {
            let a = python_frame_address(id);
            assert_eq!(python_frame_id(a), Some(id));
            assert_eq!(python_frame_id(a - 1), Some(id));
        }
        for a in [
            0,
            0x40_1000,
            0x7fff_ffff_f000,
            0xffff_ffff_ff60_0000,
            u64::MAX,
        ] {
            assert_eq!(python_frame_id(a), None, "{a:#x}");
        }
    }

    /// Each mapping takes the build id of the object whose loaded span
    /// holds its start; one in no object's span keeps none.
    #[test]
    fn mappings_take_the_build_id_of_the_object_they_lie_in() {
        let map = |start: u64| Mapping {
            start,
            end: start + 0x1000,
            offset: 0,
            path: "/x".into(),
            build_id: String::new(),
        };
        let mut d = HeapDump {
            maps: vec![map(0x1000), map(0x5000), map(0x9000)],
            ..HeapDump::default()
        };
        let id = |start: u64, end: u64, id: &str| ObjectBuildId {
            start,
            end,
            id: id.into(),
        };
        d.set_build_ids(&[id(0x0, 0x2000, "aa"), id(0x4000, 0x8000, "bb")]);
        let ids: Vec<&str> = d.maps.iter().map(|m| m.build_id.as_str()).collect();
        assert_eq!(ids, ["aa", "bb", ""]);
    }

    #[test]
    fn a_heap_profile_of_jemalloc_parses() {
        let text = "heap_v2/524288\n  t*: 65: 68157440 [0: 0]\n  t0: 65: 68157440 [0: 0]\n\
@ 0x55d5a5f2a1c4 0x55d5a5f2a0e0 0x7f9ef6029d90\n  t*: 55: 57671680 [0: 0]\n  t0: 55: 57671680 [0: 0]\n\
@ 0x55d5a5f2a1d0 0x55d5a5f2a0e0\n  t*: 58: 475136 [0: 0]\n\
@ 0x55d5a5f2a1d8\n  t*: 0: 0 [0: 0]\n\n\
MAPPED_LIBRARIES:\n55d5a5f29000-55d5a5f2b000 r-xp 00001000 fe:00 10092608   /tmp/leak with space\n\
7f9ef6000000-7f9ef6100000 rw-p 00000000 00:00 0 \n";
        let (lg, d) = HeapDump::parse(text).unwrap();
        assert_eq!(lg, 19);
        assert_eq!(d.stacks.len(), 2);
        // 55 of 1 MiB sampled at 512 KiB: each had a chance of 1 - e^-2.
        let p = 1.0 - (-2.0f64).exp();
        assert_eq!(d.stacks[0].objects, (55.0 / p).round() as u64);
        assert_eq!(d.stacks[0].bytes, (57671680.0 / p).round() as u64);
        // 58 of 8 KiB: one in 64 is sampled, 3741 estimated (4096 were made).
        assert_eq!(d.stacks[1].objects, 3741, "{:?}", d.stacks[1]);
        assert_eq!(d.bytes, d.stacks[0].bytes + d.stacks[1].bytes);
        assert_eq!(d.addrs.len(), 5);
        assert_eq!(d.stacks[1].frames, vec![3, 1]);
        assert_eq!(d.maps.len(), 1);
        assert_eq!(d.maps[0].path, "/tmp/leak with space");
        assert_eq!(d.maps[0].offset, 0x1000);
        assert!(HeapDump::parse("not a profile").is_none());
        let mut k = d.clone();
        k.keep_largest(1);
        assert_eq!((k.stacks.len(), k.dropped_stacks), (1, 1));
        assert_eq!(k.dropped_bytes, d.stacks[1].bytes);
        assert_eq!(k.addrs, vec![d.addrs[0], d.addrs[1], d.addrs[2]]);
        assert_eq!(k.stacks[0].frames, vec![0, 1, 2]);
    }
}

/// What a `python_trace` request does (CPython's tracemalloc).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum PyTraceAction {
    /// Report whether tracemalloc traces; change nothing.
    #[default]
    Status,
    /// Start tracing (`frames` deep), to be stopped by the shim after
    /// `seconds` at the latest; nothing if the program traces already.
    Start,
    /// The live traced memory now, by the line that allocated it.
    Snapshot,
    /// Stop tracing, if this shim started it (the program's own tracing
    /// is never stopped).
    Stop,
}

/// The most seconds tracemalloc may run when the shim starts it.
pub const MAX_PY_TRACE_SECONDS: u64 = 3600;
/// The most frames a `python_trace` start may ask for.
pub const MAX_PY_TRACE_FRAMES: u32 = 64;

/// The answer to `python_trace`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct PyTraceReply {
    /// tracemalloc traces now (after the action).
    pub tracing: bool,
    /// The shim started it (and stops it at the deadline, or on `stop`).
    pub ours: bool,
    /// This request started or stopped it.
    pub changed: bool,
    /// Frames kept per allocation.
    pub frames: u32,
    /// Bytes tracemalloc sees allocated now, and its peak.
    pub traced_bytes: u64,
    /// Peak of `traced_bytes` since tracing started.
    pub peak_bytes: u64,
    /// What tracemalloc itself holds for its traces.
    pub overhead_bytes: u64,
    /// Milliseconds until the shim stops the tracing it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stops_in_ms: Option<u64>,
    /// The live traced memory by line (action `snapshot`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<PySnapshot>,
}

/// Live traced memory, by the line that allocated it (innermost frame).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct PySnapshot {
    /// The lines holding most, largest first (at most the `top` asked for).
    pub lines: Vec<PyLine>,
    /// Bytes over every trace.
    pub bytes: u64,
    /// Live traced allocations.
    pub count: u64,
    /// Distinct lines (`lines` may hold fewer).
    pub distinct_lines: u64,
    /// Milliseconds the snapshot held the GIL.
    pub elapsed_ms: f64,
}

/// What one line of Python code holds.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct PyLine {
    /// The file, as the code object names it.
    pub file: String,
    /// The line number.
    pub line: u32,
    /// Live bytes.
    pub bytes: u64,
    /// Live allocations.
    pub count: u64,
}
