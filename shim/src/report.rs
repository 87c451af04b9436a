//! `MEMSHIM_VERBOSE=1`: the effective settings, printed once at start-up.

use crate::{jemalloc, log, options, os};

/// Prints the effective settings (called from the constructor).
pub fn print_verbose(interposed: bool) {
    let o = jemalloc::opts();
    let (affinity, quota) = options::effective_cpus();
    log::info(format_args!(
        "libmemshim {} (jemalloc {}), pid {}, interposed={}",
        env!("CARGO_PKG_VERSION"),
        jemalloc::version(),
        os::getpid(),
        if interposed { "yes" } else { "no" },
    ));
    log::info(format_args!(
        "dirty_decay_ms={} muzzy_decay_ms={} narenas={} tcache_max={} oversize_threshold={} retain={}",
        o.dirty_decay_ms, o.muzzy_decay_ms, o.narenas, o.tcache_max, o.oversize_threshold, o.retain,
    ));
    log::info(format_args!(
        "control={:?} clear_deepbind={} fd_table={:?} cpus: affinity={} quota={}",
        options::control(),
        options::clear_deepbind(),
        options::fd_table(),
        affinity,
        match quota {
            Some(q) => q as i64,
            None => -1,
        },
    ));
    log::info(format_args!(
        "jemalloc conf: {}",
        core::str::from_utf8(options::jemalloc_conf()).unwrap_or("?")
    ));
    // Every setting of the table, as read: the value given, or the default.
    for s in memshim_proto::settings::ALL {
        let given = os::env::vars(&[s.name.as_bytes()])[0];
        match given {
            Some(v) if s.accepts(v) => log::info(format_args!(
                "{}={}",
                s.name,
                core::str::from_utf8(v).unwrap_or("(not UTF-8)")
            )),
            Some(_) => log::info(format_args!(
                "{}={} (default: the value given is not valid)",
                s.name, s.default
            )),
            None => log::info(format_args!("{}={} (default)", s.name, s.default)),
        }
    }
}
