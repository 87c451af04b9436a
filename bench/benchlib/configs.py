"""The allocator configurations every scenario runs under."""

import os
from dataclasses import dataclass, field

from .anchors import ANCHORS, path as anchor_path

LIBDIR = "/usr/lib/x86_64-linux-gnu"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# BENCH_SHIM=/path/libmemshim.so measures another build (default: this checkout's release build).
SHIM = os.environ.get("BENCH_SHIM") or os.path.join(ROOT, "target", "release", "libmemshim.so")
# The wheels' builds of the same checkout (`make wheel`: zig), what pip users preload: "memshim-wheel" is the
# manylinux_2_34 wheel's library (glibc 2.34's symbols; what pip installs on this machine and wherever glibc is
# 2.34 or newer), "memshim-wheel217" the manylinux_2_17 one's (glibc 2.17's symbols, for older glibc). Only
# where --configs names them (make test-shipped's smoke, BENCHMARKS.md's start-up runs).
WHEEL_SHIM = os.path.join(ROOT, "target", "glibc2.34", f"{os.uname().machine}-unknown-linux-gnu", "release",
                          "libmemshim.so")
WHEEL217_SHIM = os.path.join(ROOT, "target", f"{os.uname().machine}-unknown-linux-gnu", "release", "libmemshim.so")
# BENCH_BASE_SHIM=/path/libmemshim.so adds "memshim-base", an earlier build measured in the same run,
# for before/after tables of a change (BENCH_BASE_LABEL names it).
BASE_SHIM = os.environ.get("BENCH_BASE_SHIM", "")
# BENCH_PAGE8K_SHIM=/path/libmemshim.so (built with JEMALLOC_SYS_WITH_LG_PAGE=13) adds "ms-page8k" and
# "ms-page8k-t32k", "ms-page8k-n2"/"-n4"/"-n8" and "ms-page8k-n2-slab8k"/"-slab28k"/"-slabfit", named with --configs
# only (bench/FINDINGS-medium.md).
PAGE8K_SHIM = os.environ.get("BENCH_PAGE8K_SHIM", "")
# Slab sizes in 8 KiB pages, per small size class (inclusive byte ranges): for each class the fewest pages
# whose slab wastes at most an eighth of itself on the tail (jemalloc's default is the least common multiple
# of page and class size, so most slabs double with the page).
SLABFIT_8K = ("8-2560:1|3072-3072:2|3584-4096:1|5120-5120:2|6144-6144:3|7168-8192:1|10240-10240:4|"
              "12288-12288:3|14336-16384:2|20480-20480:5|24576-24576:3|28672-28672:4")

# Variables a configuration may set; all of them are cleared from the harness's
# own environment first so that nothing leaks from the caller into a run.
CONTROLLED_PREFIXES = ("LD_PRELOAD", "MALLOC_", "_RJEM_MALLOC_CONF", "MEMSHIM_", "GLIBC_TUNABLES",
                       "BENCH_MALLOC_TRIM", "PYTHONMALLOC", "MIMALLOC_", "TCMALLOC_")


@dataclass
class Config:
    name: str          # short id used in tables and file names
    label: str         # what it is, for the report
    preload: str = ""  # LD_PRELOAD path, "" for glibc
    env: dict = field(default_factory=dict)
    variant: bool = False  # a memshim tuning variant (defaults study), not a competitor
    study: bool = False    # a variant of a separate study: only where --configs names it

    def missing(self):
        return bool(self.preload) and not os.path.exists(self.preload)

    def environ(self, extra=None):
        e = {k: v for k, v in os.environ.items() if not k.startswith(CONTROLLED_PREFIXES)}
        if self.preload:
            e["LD_PRELOAD"] = self.preload
        e.update(self.env)
        if extra:
            e.update(extra)
        return e


def competitors():
    return [
        Config("glibc", "glibc 2.36 malloc, as shipped"),
        Config("glibc-trim128k", "glibc, MALLOC_TRIM_THRESHOLD_=131072 (best glibc tuning)",
               env={"MALLOC_TRIM_THRESHOLD_": "131072"}),
        Config("glibc-arena2", "glibc, MALLOC_ARENA_MAX=2", env={"MALLOC_ARENA_MAX": "2"}),
        Config("glibc-malloc_trim", "glibc + malloc_trim(0) after every unload (code change)",
               env={"BENCH_MALLOC_TRIM": "1"}),
        Config("jemalloc", "Debian libjemalloc.so.2 (5.3.0), defaults", preload=f"{LIBDIR}/libjemalloc.so.2"),
        Config("tcmalloc", "Debian libtcmalloc_minimal.so.4 (gperftools 2.10)",
               preload=f"{LIBDIR}/libtcmalloc_minimal.so.4"),
        Config("mimalloc", "Debian libmimalloc.so.2 (2.0.9)", preload=f"{LIBDIR}/libmimalloc.so.2"),
    ] + [Config(name, label, preload=anchor_path(name)) for name, (_, label) in ANCHORS.items()] + [
        Config("memshim", "memshim, defaults", preload=SHIM),
    ] + ([Config("memshim-base", "memshim, defaults, " + os.environ.get("BENCH_BASE_LABEL", "earlier build")
                 + f" ({BASE_SHIM})", preload=BASE_SHIM)] if BASE_SHIM else []) + [
        Config("memshim-wheel", "memshim, defaults, the manylinux_2_34 wheel's build (make wheel: zig, glibc 2.34)",
               preload=WHEEL_SHIM, study=True),
        Config("memshim-wheel217", "memshim, defaults, the manylinux_2_17 wheel's build (make wheel: zig, glibc 2.17)",
               preload=WHEEL217_SHIM, study=True),
        # The heap profiler's cost (bench/FINDINGS-profiling.md): only where --configs names them.
        Config("ms-profile", "memshim, MEMSHIM_PROFILE=on (heap profiler ready, not sampling)", SHIM,
               {"MEMSHIM_PROFILE": "on"}, study=True),
        Config("ms-sampling", "memshim, MEMSHIM_PROFILE=start (sampling one allocation per 512 KiB from the start)",
               SHIM, {"MEMSHIM_PROFILE": "start"}, study=True),
    ] + ([
        # Issue 48, item 2 (bench/FINDINGS-medium.md): jemalloc built with 8 KiB pages
        # (JEMALLOC_SYS_WITH_LG_PAGE=13), whose thread caches may then hold blocks up to 64 KiB.
        Config("ms-page8k", "memshim built with 8 KiB jemalloc pages, tcache_max 64 KiB",
               PAGE8K_SHIM, {"MEMSHIM_MALLOC_CONF": "tcache_max:65536"}, study=True),
        Config("ms-page8k-t32k", "memshim built with 8 KiB jemalloc pages, tcache_max 32 KiB (the default)",
               PAGE8K_SHIM, study=True),
    ] + [
        Config(f"ms-page8k-n{n}", f"memshim built with 8 KiB jemalloc pages, tcache_max 64 KiB, "
               f"{n} cached blocks per large size class (tcache_nslots_large; 20 by default)",
               PAGE8K_SHIM, {"MEMSHIM_MALLOC_CONF": f"tcache_max:65536,tcache_nslots_large:{n}"}, study=True)
        for n in (2, 4, 8)
    ] + [
        # Slabs of one 8 KiB page for the small classes up to `top` (jemalloc's default is the
        # least common multiple of the page and the class size, so most slabs double with the page).
        Config(f"ms-page8k-n2-slab{top // 1024}k", f"ms-page8k-n2, and slabs of one page for the small "
               f"size classes up to {top // 1024} KiB (slab_sizes)", PAGE8K_SHIM,
               {"MEMSHIM_MALLOC_CONF": f"tcache_max:65536,tcache_nslots_large:2,slab_sizes:1-{top}:1"}, study=True)
        for top in (8192, 28672)
    ] + [
        Config("ms-page8k-n2-slabfit", "ms-page8k-n2, and for each small size class the smallest slab that "
               "wastes at most an eighth of itself (slab_sizes)", PAGE8K_SHIM,
               {"MEMSHIM_MALLOC_CONF": "tcache_max:65536,tcache_nslots_large:2,slab_sizes:" + SLABFIT_8K}, study=True),
    ] if PAGE8K_SHIM else [])


# memshim variants for choosing the defaults; each differs from the defaults in one knob.
def variants():
    return [
        Config("ms-decay0", "memshim, dirty_decay_ms 0 (purge at once)", SHIM,
               {"MEMSHIM_DIRTY_DECAY_MS": "0"}, True),
        Config("ms-decay5s", "memshim, dirty_decay_ms 5000", SHIM, {"MEMSHIM_DIRTY_DECAY_MS": "5000"}, True),
        Config("ms-decay10s", "memshim, dirty_decay_ms 10000 (jemalloc's default)", SHIM,
               {"MEMSHIM_DIRTY_DECAY_MS": "10000"}, True),
        Config("ms-nodecay", "memshim, decay off (-1): the PyTorch-tuning-guide style", SHIM,
               {"MEMSHIM_DIRTY_DECAY_MS": "-1", "MEMSHIM_MUZZY_DECAY_MS": "-1"}, True),
        Config("ms-oversize8m", "memshim, oversize_threshold 8 MiB (jemalloc's default)", SHIM,
               {"MEMSHIM_MALLOC_CONF": "oversize_threshold:8388608"}, True),
        Config("ms-tcache4k", "memshim, tcache_max 4096 (smaller thread caches)", SHIM,
               {"MEMSHIM_MALLOC_CONF": "tcache_max:4096"}, True),
        # No larger tcache_max variant: jemalloc 5.3.1 caps opt.tcache_max at 8 of its pages
        # (TCACHE_LG_MAXCLASS_LIMIT = LG_USIZE_GROW_SLOW_THRESHOLD = 15 with 4 KiB pages) and clips
        # larger values silently, so tcache_max:65536 reads back as 32768 and measures nothing.
        # jemalloc's cache-oblivious layout, which the defaults turn off (cache_oblivious:false): each
        # large block at a random cache-line offset in one extra page (docs/configuration.md).
        Config("ms-oblivious", "memshim, cache_oblivious on (jemalloc's layout: one extra page per block of 16 KiB+)",
               SHIM, {"MEMSHIM_MALLOC_CONF": "cache_oblivious:true"}, True),
        # One arena per CPU: less peak RSS (memory one thread frees is reused by the next sooner), but two
        # busy threads may share an arena while another sits idle (bench/FINDINGS-issue15.md, (d)).
        Config("ms-narenas1x", "memshim, one arena per CPU (auto keeps jemalloc's 4 per CPU)", SHIM,
               {"MEMSHIM_NARENAS": str(len(os.sched_getaffinity(0)))}, True),
        # jemalloc's per-CPU arenas: a thread allocates from the arena of the CPU it runs on
        # (bench/FINDINGS-percpu.md, issue 36; bench/percpu_study.py names it, the full run leaves it out).
        Config("ms-percpu", "memshim, percpu_arena:percpu (one arena per CPU, chosen by the running CPU)", SHIM,
               {"MEMSHIM_MALLOC_CONF": "percpu_arena:percpu"}, True, study=True),
        # Deeper thread caches for small sizes (jemalloc: 2 x a slab's regions per size class, at most 200):
        # what glibc-simple's pattern (1000 blocks of one size, then all freed) trails on
        # (BENCHMARKS.md, "The suite's patterns"); only where --configs names it.
        Config("ms-slots", "memshim, thread caches of up to 2048 small blocks per size class "
               "(tcache_nslots_small_max:2048, lg_tcache_nslots_mul:4)", SHIM,
               {"MEMSHIM_MALLOC_CONF": "tcache_nslots_small_max:2048,lg_tcache_nslots_mul:4"}, True, study=True),
    ]


def by_name():
    return {c.name: c for c in competitors() + variants()}
