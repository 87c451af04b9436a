//! Heap profiles: a profile after symbolization and its table (heap.rs),
//! addresses to names (symbols.rs), caches that keep memory on purpose
//! (retainers.rs), tracemalloc's view for `--python` (tracemalloc.rs), and
//! the formats a profile is written in: pprof, speedscope, inferno's flame
//! graph (flame.rs) and the self-contained HTML report (report.rs).

pub mod flame;
pub mod heap;
pub mod pprof;
pub mod report;
pub mod retainers;
pub mod speedscope;
pub mod symbols;
pub mod tracemalloc;
