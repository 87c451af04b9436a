"""Scenario parameters of the full run and of the smoke run."""

from .configs import BASE_SHIM

ALL_VARIANTS = ["ms-decay0", "ms-decay5s", "ms-decay10s", "ms-nodecay", "ms-oversize8m", "ms-tcache4k",
                "ms-oblivious", "ms-narenas1x"]
# The registry anchors (mimalloc3, jemalloc531) join the Python and start-up scenarios; mimalloc2 only
# scenarios 1-4, to keep the full run's time in check.
# memshim-wheel and memshim-wheel217 (the wheels' builds) run where --configs names them (make test-shipped),
# and in scenarios 6 and 9 of a run that names none, where they are built ("builds").
WHEEL_BUILDS = ["memshim-wheel", "memshim-wheel217"]
PY_CONFIGS = ["glibc", "jemalloc", "tcmalloc", "mimalloc", "mimalloc3", "jemalloc531", "memshim"] + WHEEL_BUILDS + (
    ["memshim-base"] if BASE_SHIM else [])
# s9: mimalloc-bench's patterns, beside every peer the suite compares (mimalloc2 left out, as in s5/s6).
PATTERN_CONFIGS = ["glibc", "jemalloc", "tcmalloc", "mimalloc", "jemalloc531", "mimalloc3", "memshim"] + WHEEL_BUILDS

# s8 on live cgroup v2, in the tests' VM (TCG: code runs 5-50x slower): the pressure tests' sizes
# (tests/tests/cgroup/pressure.rs: A fits under the threshold even under THP `always`), B in 4 MiB steps
# 50 ms apart, polled every 1 ms (0.2 ms would take a whole emulated CPU), 2 vCPUs (the poller, A's
# thread and B), fewer repetitions: about 5 minutes on the 2-core machine.
S8_V2 = {"kernel": "newest", "vcpus": 2, "mem_mib": 1536, "thp": "madvise", "limit_mib": 320, "a_mib": 224,
         "b_mib": 140, "step_mib": 4, "step_ms": 50, "poll_s": 0.001, "timeout_s": 1200,
         "max": {"configs": ["glibc", "jemalloc", "memshim", "memshim, MEMSHIM_PRESSURE=off"], "reps": 3},
         "high": {"configs": ["memshim", "memshim, MEMSHIM_PRESSURE=off"], "reps": 2}}

FULL = {
    # s3: 3 repetitions (side by side, 80 s each): its peak RSS hinges on a few big-buffer reuses and
    # moved by +-15 % between single runs on the 2-core VM (bench/FINDINGS-issue15.md).
    # s2: 3, so that its median resists one run in the slow mode that 8 threads on 2 CPUs fall into
    # now and then (throughput 2 against 15 M ops/s for the same library); the idle periods overlap.
    "reps": {"s1": 1, "s2": 3, "s3": 3, "s4": 3, "s5": 1},
    "s1": {"kind": "auto", "modes": ["thread", "main"], "cycles": 5, "idle": 2.0, "final_idle": 3.0, "scale": 1.0,
           "variants": [], "main_configs": ["glibc", "glibc-trim128k", "glibc-malloc_trim", "jemalloc", "memshim"]},
    "s2": {"threads": 8, "ops": 300000, "slots": 2000, "idle_checkpoints": [1, 6, 30], "variants": ALL_VARIANTS},
    "s3": {"threads": 4, "rate": 200, "seconds": 60, "idle": 20, "idle_step": 2, "variants": ALL_VARIANTS},
    "s4": {"kernels": ["prodcons", "larson", "small", "medium", "large"], "threads": [1, 2, 4], "seconds": 0.3,
           "seconds_large": 1.0, "variants": ALL_VARIANTS, "variant_kernels": ["medium", "large"]},
    "s5": {"pyperf": True, "processes": 2, "values": 3, "micro_scale": 1.0, "micro_repeat": 3,
           "configs": PY_CONFIGS},
    "s6": {"n_true": 300, "n_python": 40, "n_loop": 3, "loop": 1000, "configs": PY_CONFIGS, "builds": WHEEL_BUILDS},
    "s7": {"n_stats": 200, "n_purge": 20, "n_py": 20, "bert": True, "exit_rounds": 50},
    # s8: issue 13's cgroup, at 3/4 of its heap so that B fits beside A's live half once A purges.
    "s8": {"limit_mib": 700, "a_mib": 512, "b_mib": 352, "reps": 3, "idle_seconds": 60, "v2": S8_V2},
    # s9: each kernel a fixed amount of work (0.1 to 8 s per run under glibc on the 2-CPU VM, xmalloc the
    # longest); 5 rounds, 9 configurations: about 2.5 minutes.
    "s9": {"runs": 5, "threads": 2, "scale": 1.0, "configs": PATTERN_CONFIGS, "builds": WHEEL_BUILDS},
}

SMOKE = {
    "reps": {"s1": 1, "s2": 1, "s3": 1, "s4": 1, "s5": 1},
    "s1": {"kind": "smoke", "modes": ["thread", "main"], "cycles": 2, "idle": 0.2, "final_idle": 0.2, "scale": 0.05,
           "variants": []},
    "s2": {"threads": 8, "ops": 5000, "slots": 200, "idle_checkpoints": [0.2, 0.5], "variants": ["ms-decay0"]},
    "s3": {"threads": 2, "rate": 100, "seconds": 1, "idle": 0.6, "idle_step": 0.3, "variants": []},
    "s4": {"kernels": ["prodcons", "larson", "small", "medium", "large"], "threads": [1, 2], "seconds": 0.1,
           "seconds_large": 0.2, "variants": ["ms-nodecay"], "variant_kernels": ["large"]},
    "s5": {"pyperf": False, "processes": 1, "values": 1, "micro_scale": 0.02, "micro_repeat": 1,
           "configs": PY_CONFIGS},
    "s6": {"n_true": 5, "n_python": 2, "n_loop": 1, "loop": 20, "configs": PY_CONFIGS},
    "s7": {"n_stats": 5, "n_purge": 2, "n_py": 2, "bert": False, "exit_rounds": 1},
    # s8 is optional here: it skips itself without root or a writable memory cgroup.
    "s8": {"limit_mib": 320, "a_mib": 256, "b_mib": 140, "reps": 1, "idle_seconds": 2, "configs": ["memshim"],
           # About 40 s (boot 6-11 s): one run under each limit; a VM that hangs fails in 5 minutes, not 20.
           "v2": dict(S8_V2, max={"configs": ["memshim"], "reps": 1}, high={"configs": ["memshim"], "reps": 1},
                      timeout_s=300)},
    "s9": {"runs": 1, "threads": 2, "scale": 0.02, "configs": ["glibc", "jemalloc", "memshim"]},
}
