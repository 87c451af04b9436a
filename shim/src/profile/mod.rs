//! Heap profiles from outside: the `profile` request (docs/profile.md).
//!
//! jemalloc can sample allocations only if it started with `prof:true`,
//! which `MEMSHIM_PROFILE=on` asks for, inactive (`prof_active:false`):
//! see options.rs for the string and BENCHMARKS.md for what it costs. This
//! module switches sampling on and off and reads the live samples, on the
//! shim's thread, one request at a time.
//!
//! Call stacks come from libgcc's `_Unwind_Backtrace`, the unwinder glibc
//! itself loads: a process holds one unwinder, as without the shim. The
//! forwarder in os/unwind.c never loads it inside an allocation, so
//! [`start`] loads it here first, and takes one backtrace, so that libgcc
//! sets up its own state on this thread rather than inside a sample. No
//! `libgcc_s.so.1` (a static or distroless image): sampling is refused.
//!
//! A dump goes through a file: jemalloc writes its profile only to a path
//! (`prof.dump`). The file is `<socket dir>/<socket name>.heap` (the caller
//! gives the path and its name), in the directory that holds this process's
//! socket (owned by its uid, mode 0700). The shim only names it in its
//! answer: the client, which may connect only with the same uid or as root,
//! reads it, parses it outside this process and removes it. A file a
//! client left behind is removed before the next dump.

#[cfg(not(memshim_bridge))]
mod frame_table;
#[cfg(not(memshim_bridge))]
mod python_stack;

use crate::{jemalloc, options, os};
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};
use memshim_proto::{
    DEFAULT_PROFILE_SECONDS, ErrorCode, ErrorReply, MAX_PROFILE_SECONDS, ProfileAction,
    ProfileReply,
};
use std::ffi::CString;

touched_at_start! {
    /// Monotonic ms when sampling last started; 0: never, or stopped since.
    static STARTED_MS: AtomicU64 = AtomicU64::new(0);
    /// Monotonic ms at which the shim switches off the sampling a `profile`
    /// request started; 0: none (off, or `MEMSHIM_PROFILE=start`).
    static DEADLINE_MS: AtomicU64 = AtomicU64::new(0);
}

fn off() -> ErrorReply {
    if cfg!(memshim_bridge) {
        return ErrorReply::new(
            ErrorCode::ProfilingOff,
            "memshim was attached to this process, which has its own allocator: native heap profiles \
             sample inside libmemshim.so's jemalloc, so they need the process started with \
             LD_PRELOAD=libmemshim.so and MEMSHIM_PROFILE=on; `profile --python` works attached",
        );
    }
    ErrorReply::new(
        ErrorCode::ProfilingOff,
        "this process started without MEMSHIM_PROFILE=on, so jemalloc's profiler cannot be switched on in it; \
         restart it with MEMSHIM_PROFILE=on (it samples nothing until asked)",
    )
}

fn internal(what: &str, e: impl core::fmt::Display) -> ErrorReply {
    ErrorReply::new(ErrorCode::Internal, format!("{what} failed: {e}"))
}

/// Runs one `profile` request; a dump goes to `dump_path`, whose name in
/// the socket's directory is `dump_name`.
pub fn request(
    action: ProfileAction,
    seconds: Option<u64>,
    now_ms: u64,
    dump_path: &CString,
    dump_name: &str,
) -> Result<ProfileReply, ErrorReply> {
    if !options::profile() || !jemalloc::prof_ready() {
        return Err(off());
    }
    let seconds = seconds.unwrap_or(DEFAULT_PROFILE_SECONDS);
    if !(1..=MAX_PROFILE_SECONDS).contains(&seconds) {
        return Err(ErrorReply::new(
            ErrorCode::InvalidArgument,
            format!("seconds {seconds} is not from 1 to {MAX_PROFILE_SECONDS}"),
        ));
    }
    let was = jemalloc::prof_active();
    let mut dump_file = None;
    let mut build_ids = Vec::new();
    #[cfg_attr(memshim_bridge, allow(unused_mut))]
    let mut python_frames = Vec::new();
    match action {
        ProfileAction::Status => {}
        ProfileAction::Start if !was => {
            start(now_ms)?;
            walk_python_frames();
            DEADLINE_MS.store(now_ms + seconds * 1000, Relaxed);
        }
        // Sampling a request started: the later deadline of the two.
        ProfileAction::Start => {
            let d = DEADLINE_MS.load(Relaxed);
            if d != 0 {
                DEADLINE_MS.store(d.max(now_ms + seconds * 1000), Relaxed);
            }
        }
        ProfileAction::Stop => stop()?,
        ProfileAction::Reset => {
            jemalloc::prof_reset().map_err(|e| internal("prof.reset", e))?;
            // What a profile shows now was sampled from here on: the
            // `active_ms` a client reads is that window.
            if was {
                STARTED_MS.store(now_ms.max(1), Relaxed);
            }
        }
        ProfileAction::Dump => {
            walk_python_frames();
            write_dump(dump_path)?;
            dump_file = Some(dump_name.to_owned());
            build_ids = os::dl::build_ids();
            #[cfg(not(memshim_bridge))]
            {
                python_frames = frame_table::frames();
            }
        }
    }
    let active = jemalloc::prof_active();
    let started = STARTED_MS.load(Relaxed);
    let deadline = DEADLINE_MS.load(Relaxed);
    Ok(ProfileReply {
        active,
        changed: active != was,
        lg_sample: jemalloc::prof_lg_sample(),
        active_ms: (active && started != 0).then(|| now_ms.saturating_sub(started)),
        stops_in_ms: (active && deadline != 0).then(|| deadline.saturating_sub(now_ms)),
        dump: None,
        dump_file,
        build_ids,
        python_frames,
    })
}

/// In a CPython: has the bridge register its exit hooks, which stop the
/// walks of Python frames before the interpreter frees other threads'
/// states and end them once it has finalized (profile/python_stack.rs),
/// then lets samples carry Python frames. A busy GIL (200 ms) leaves it
/// for the next request.
fn walk_python_frames() {
    #[cfg(not(memshim_bridge))]
    if !python_stack::ready()
        && python_stack::prepare().is_none()
        && crate::python::ensure_hooks(std::time::Duration::from_millis(200))
    {
        python_stack::enable();
    }
}

fn stop() -> Result<(), ErrorReply> {
    jemalloc::set_prof_active(false).map_err(|e| internal("prof.active", e))?;
    STARTED_MS.store(0, Relaxed);
    DEADLINE_MS.store(0, Relaxed);
    Ok(())
}

/// Whether sampling a request started has a deadline still to come: the
/// shim's thread stays until it has switched it off.
pub fn pending() -> bool {
    DEADLINE_MS.load(Relaxed) != 0
}

/// The shim's thread, every turn: switches off the sampling a request
/// started once its deadline has passed (a client killed during its wait
/// does not leave the process sampling).
pub fn tick(now_ms: u64) {
    let d = DEADLINE_MS.load(Relaxed);
    if d != 0 && now_ms >= d {
        let _ = stop();
    }
}

/// `MEMSHIM_PROFILE=start`: sampling from the library's constructor on,
/// the unwinder loaded there first (a constructor may load a library: the
/// loader's lock is recursive, and nothing allocates inside jemalloc here).
/// Samples made before, by allocations in earlier constructors, are not
/// taken. A process without `libgcc_s.so.1` gets one warning line.
#[unsafe(link_section = ".text.startup")]
pub fn at_load() {
    if !options::profile_from_start() {
        return;
    }
    // A CPython loaded with the program (never unloaded): its frames from
    // the first sample on.
    #[cfg(not(memshim_bridge))]
    if python_stack::prepare().is_none() {
        python_stack::enable();
    }
    if let Err(e) = start(os::time::monotonic_ms()) {
        crate::log::warning(format_args!(
            "MEMSHIM_PROFILE=start: sampling could not start: {}",
            e.message
        ));
    }
}

/// Loads the unwinder, warms it up on this thread, then starts sampling.
fn start(now_ms: u64) -> Result<(), ErrorReply> {
    if !jemalloc::prof_unwinds_with_dwarf() {
        return Err(ErrorReply::new(
            ErrorCode::ProfilingOff,
            "this libmemshim.so was built with a jemalloc that walks frame pointers for its call stacks, \
             which crashes on code built without them; sampling is refused (rebuild it with `make` or \
             `make wheel`, which configure jemalloc for libgcc's unwinder)",
        ));
    }
    if !os::unwind::load() {
        return Err(ErrorReply::new(
            ErrorCode::ProfilingOff,
            "libgcc_s.so.1 could not be loaded in this process, and without it no call stack can be taken; \
             install the libgcc-s1 package (libgcc on RHEL) in the image",
        ));
    }
    os::unwind::warm_up();
    jemalloc::set_prof_active(true).map_err(|e| internal("prof.active", e))?;
    STARTED_MS.store(now_ms.max(1), Relaxed);
    Ok(())
}

/// Has jemalloc write the live samples to `path`, next to the socket
/// (what an earlier client left there is removed first).
fn write_dump(path: &CString) -> Result<(), ErrorReply> {
    use std::os::unix::ffi::OsStrExt;
    let _ = std::fs::remove_file(std::ffi::OsStr::from_bytes(path.as_bytes()));
    jemalloc::prof_dump(path)
        .map_err(|e| internal(&format!("prof.dump to {}", path.to_string_lossy()), e))
}

/// Fork child: sampling a `profile` request started in the parent is the
/// parent's; the child, which nobody asked to sample, stops (it may never
/// run a shim thread that would see the deadline). `MEMSHIM_PROFILE=start`
/// sampling goes on, as the environment asks. Runs after jemalloc's own
/// child handler (its locks are new, and this thread is the only one).
#[unsafe(link_section = ".text.startup")]
pub fn after_fork_child() {
    use crate::os::ResetTo;
    #[cfg(not(memshim_bridge))]
    python_stack::after_fork_child();
    if DEADLINE_MS.load(Relaxed) != 0 {
        let _ = jemalloc::set_prof_active(false);
        STARTED_MS.reset_to(0);
        DEADLINE_MS.reset_to(0);
    }
}
