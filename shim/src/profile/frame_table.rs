//! The Python frames samples have met, each kept once with its names
//! copied (python_stack.rs fills it inside a sample; a dump reads it).
//!
//! A sample cannot keep a reference to a code object (that needs the GIL),
//! and a code object may be freed and its address reused long before the
//! sample is dumped. So the first sample that meets a frame (a code object
//! at an instruction) copies its file name, function name and line here,
//! and its stack holds the slot's id; a later one finds it by code,
//! instruction and names, without decoding the line again.
//!
//! Fixed size, in `.bss` (untouched, and so free, in a process that never
//! samples), filled without a lock or an allocation: a slot is claimed with
//! one compare-and-swap and published with a release store. Two threads
//! that meet the same new frame at once may fill two slots with the same
//! names (a reader merges them by name). Once full, a frame not yet in the
//! table gets [`PYTHON_FRAME_UNKNOWN`]. The table is never cleared: a
//! stack sampled long ago may still be live, and dumped again.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicU8, AtomicU32, AtomicUsize, Ordering::*};
use memshim_proto::{PYTHON_FRAME_UNKNOWN, PythonFrame};

/// Slots in the table: distinct (code, instruction) pairs a process's
/// samples meet. 8192 slots are 2 MiB of address space, touched as they fill.
pub const SLOTS: usize = 8192;
/// Bytes kept of a file name (its end), and of a function name.
pub const FILE_BYTES: usize = 176;
pub const FUNCTION_BYTES: usize = 64;
/// Slots looked at before a frame counts as not found.
const PROBES: usize = 64;

const EMPTY: u8 = 0;
const FILLING: u8 = 1;
const READY: u8 = 2;

/// What finds a frame: the code object and the instruction in it, and the
/// objects of its names. A code object freed and another made at its
/// address may have name objects made at the freed ones' too, so the names
/// themselves are compared as well ([`intern`]). What stays: such a code
/// object of the same names, whose lines differ (the same function
/// compiled again from an edited source), keeps the first one's line.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Key {
    pub code: usize,
    pub file: usize,
    pub name: usize,
    /// The instruction's offset in the code (the version's own unit).
    pub at: u32,
}

struct Slot {
    state: AtomicU8,
    code: AtomicUsize,
    file_obj: AtomicUsize,
    name_obj: AtomicUsize,
    at: AtomicU32,
    line: AtomicU32,
    file_len: AtomicU32,
    function_len: AtomicU32,
    /// Written once, by the thread that claimed the slot, before `state`
    /// is READY; read only after.
    file: UnsafeCell<[u8; FILE_BYTES]>,
    function: UnsafeCell<[u8; FUNCTION_BYTES]>,
}

// SAFETY: the byte arrays are written only by the one thread that claimed
// the slot (EMPTY -> FILLING), and read only after its release store of
// READY has been seen with acquire.
unsafe impl Sync for Slot {}

#[allow(clippy::declare_interior_mutable_const)]
const SLOT: Slot = Slot {
    state: AtomicU8::new(EMPTY),
    code: AtomicUsize::new(0),
    file_obj: AtomicUsize::new(0),
    name_obj: AtomicUsize::new(0),
    at: AtomicU32::new(0),
    line: AtomicU32::new(0),
    file_len: AtomicU32::new(0),
    function_len: AtomicU32::new(0),
    file: UnsafeCell::new([0; FILE_BYTES]),
    function: UnsafeCell::new([0; FUNCTION_BYTES]),
};

static TABLE: [Slot; SLOTS] = [SLOT; SLOTS];

fn start(k: &Key) -> usize {
    let h = (k.code as u64 ^ (u64::from(k.at) << 32) ^ (k.name as u64).rotate_left(17))
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> 40) as usize % SLOTS
}

/// The id of the frame `k` whose names are `file` (its end, at most
/// [`FILE_BYTES`]) and `function` (at most [`FUNCTION_BYTES`]), filling a
/// new slot with them and `line()` if the frame is new. A slot of the same
/// objects but other names is another frame: a code object freed, and
/// another made at its address with name strings made at theirs (code
/// built by `exec`, regenerated modules); the names are compared, not
/// trusted. Async-signal-safe: no lock, no allocation.
pub fn intern(k: Key, file: &[u8], function: &[u8], line: impl FnOnce() -> u32) -> u32 {
    let file = &file[..file.len().min(FILE_BYTES)];
    let function = &function[..function.len().min(FUNCTION_BYTES)];
    let first = start(&k);
    for i in 0..PROBES {
        let n = (first + i) % SLOTS;
        let s = &TABLE[n];
        match s.state.load(Acquire) {
            READY
                if s.code.load(Relaxed) == k.code
                    && s.at.load(Relaxed) == k.at
                    && s.file_obj.load(Relaxed) == k.file
                    && s.name_obj.load(Relaxed) == k.name
                    && names_are(s, file, function) =>
            {
                return n as u32;
            }
            EMPTY => {
                if s.state
                    .compare_exchange(EMPTY, FILLING, Acquire, Relaxed)
                    .is_err()
                {
                    continue;
                }
                // SAFETY: this thread claimed the slot; nobody reads its
                // buffers until READY.
                unsafe {
                    (&mut *s.file.get())[..file.len()].copy_from_slice(file);
                    (&mut *s.function.get())[..function.len()].copy_from_slice(function);
                }
                let (f, g, line) = (file.len(), function.len(), line());
                s.code.store(k.code, Relaxed);
                s.file_obj.store(k.file, Relaxed);
                s.name_obj.store(k.name, Relaxed);
                s.at.store(k.at, Relaxed);
                s.line.store(line, Relaxed);
                s.file_len.store(f.min(FILE_BYTES) as u32, Relaxed);
                s.function_len.store(g.min(FUNCTION_BYTES) as u32, Relaxed);
                s.state.store(READY, Release);
                return n as u32;
            }
            // Being filled by another thread: not comparable yet.
            _ => {}
        }
    }
    PYTHON_FRAME_UNKNOWN
}

/// Whether the READY slot `s` holds these names.
fn names_are(s: &Slot, file: &[u8], function: &[u8]) -> bool {
    let fl = s.file_len.load(Relaxed) as usize;
    let gl = s.function_len.load(Relaxed) as usize;
    // SAFETY: READY seen with acquire: the buffers are written and never
    // change again.
    let (f, g) = unsafe { (&(&*s.file.get())[..fl], &(&*s.function.get())[..gl]) };
    f == file && g == function
}

/// Every frame in the table (the shim's thread, for a dump).
pub fn frames() -> Vec<PythonFrame> {
    let mut out = Vec::new();
    for (n, s) in TABLE.iter().enumerate() {
        if s.state.load(Acquire) != READY {
            continue;
        }
        let fl = s.file_len.load(Relaxed) as usize;
        let gl = s.function_len.load(Relaxed) as usize;
        // SAFETY: READY seen with acquire: the buffers are written and
        // never change again.
        let (file, function) = unsafe { (&(&*s.file.get())[..fl], &(&*s.function.get())[..gl]) };
        out.push(PythonFrame {
            id: n as u32,
            file: String::from_utf8_lossy(file).into_owned(),
            function: String::from_utf8_lossy(function).into_owned(),
            line: s.line.load(Relaxed),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(code: usize, at: u32, name: &str) -> u32 {
        let k = Key {
            code,
            file: 1,
            name: 2,
            at,
        };
        intern(k, b"a.py", name.as_bytes(), || at + 100)
    }

    #[test]
    fn a_frame_is_kept_once_and_read_back_by_id() {
        let a = put(0x1000, 7, "load");
        let b = put(0x1000, 8, "load");
        assert_ne!(a, b);
        assert_eq!(put(0x1000, 7, "load"), a);
        let all = frames();
        let fa = all.iter().find(|f| f.id == a).unwrap();
        assert_eq!(
            (fa.file.as_str(), fa.function.as_str(), fa.line),
            ("a.py", "load", 107)
        );
    }

    /// The same objects (a code object, its name strings, all made again
    /// at the addresses of freed ones) with other names are another frame.
    #[test]
    fn objects_made_again_at_the_same_addresses_with_other_names_are_another_frame() {
        let a = put(0x2000, 3, "fn_0");
        let b = put(0x2000, 3, "fn_2");
        assert_ne!(a, b);
        let all = frames();
        let fb = all.iter().find(|f| f.id == b).unwrap();
        assert_eq!(fb.function, "fn_2");
    }
}
