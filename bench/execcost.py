#!/usr/bin/env python3
"""What preloading a library costs every exec, in figures a noisy machine cannot move.

  python3 bench/execcost.py [--runs N] [LIB ...]      (default: glibc, this checkout's libmemshim.so)

For `/bin/true` and `python3 -c pass` under each library (no LD_PRELOAD = glibc):
  instructions  user-space instructions of the whole exec (valgrind --tool=callgrind), the loader,
                the library's constructors and the program; deterministic (PYTHONHASHSEED=0)
  page faults   minor faults of the exec (wait4), median of N interleaved runs
  syscalls      syscalls of the exec (strace -c), where strace is installed
  cpu µs        user + system time (wait4), median of N interleaved runs; the one figure here that
                other load on the machine can move, shown for orientation only
Then a shell's fork and exec: `bash -c 'for i in $(seq 200); do /bin/true; done'`, minor faults per
iteration (wait4 counts the shell and every child), with every process preloaded ("all") and with
only `/bin/true` preloaded ("exec only"); "all" minus "exec only" ("shell") is what preloading the
shell costs per iteration: its fork (both sides' fork handlers) and its own allocations between
forks, whose pages each fork has made copy-on-write again.
Scenario 6 of the harness measures wall time per exec side by side; this tool explains it.
Stdlib only; valgrind and strace are optional (their columns read "–" without them)."""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from benchlib.runner import real_python  # noqa: E402


def env_for(lib):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("LD_PRELOAD", "MEMSHIM_", "MALLOC_CONF"))}
    e["PYTHONHASHSEED"] = "0"
    if lib:
        e["LD_PRELOAD"] = lib
    return e


def instructions(argv, lib):
    if not shutil.which("valgrind"):
        return None
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"] + argv,
                         env=env_for(lib), capture_output=True, text=True).stderr
    m = re.search(r"refs:\s+([\d,]+)", out)
    return int(m.group(1).replace(",", "")) if m else None


def syscalls(argv, lib):
    if not shutil.which("strace"):
        return None
    # -E puts LD_PRELOAD into the traced program only, not into strace itself.
    e = env_for(None)
    extra = ["-E", f"LD_PRELOAD={lib}"] if lib else []
    out = subprocess.run(["strace", "-c", "-f"] + extra + argv, env=e, capture_output=True, text=True).stderr
    m = re.search(r"^\s*100\.00\s+\S+\s+\S+\s+(\d+)\s+(?:\d+\s+)?total", out, re.M)
    return int(m.group(1)) if m else None


def faults_and_cpu(argv, libs, runs):
    res = {lib: ([], []) for lib in libs}
    envs = {lib: env_for(lib) for lib in libs}
    for _ in range(runs):
        for lib in libs:
            pid = os.posix_spawn(argv[0], argv, envs[lib])
            _, status, ru = os.wait4(pid, 0)
            if status != 0:
                raise SystemExit(f"execcost: {argv} under {lib or 'glibc'} exited with status {status}")
            res[lib][0].append(ru.ru_minflt)
            res[lib][1].append((ru.ru_utime + ru.ru_stime) * 1e6)
    return {lib: (statistics.median(f), statistics.median(c)) for lib, (f, c) in res.items()}


def shell_loop_faults(libs, runs, n=200):
    """Minor faults per iteration of a bash loop of /bin/true: (all preloaded, exec only)."""
    res = {lib: ([], []) for lib in libs}
    for _ in range(runs):
        for lib in libs:
            for k, (preload_shell, prefix) in enumerate([(True, ""), (False, f"LD_PRELOAD={lib} " if lib else "")]):
                env = env_for(lib if preload_shell else None)
                argv = ["/bin/bash", "-c", f"for i in $(seq {n}); do {prefix}/bin/true; done"]
                pid = os.posix_spawn(argv[0], argv, env)
                _, status, ru = os.wait4(pid, 0)
                if status != 0:
                    raise SystemExit(f"execcost: the shell loop under {lib or 'glibc'} exited with status {status}")
                res[lib][k].append(ru.ru_minflt / n)
    return {lib: (statistics.median(a), statistics.median(b)) for lib, (a, b) in res.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=200, help="interleaved runs for faults and cpu (default 200)")
    ap.add_argument("libs", nargs="*", help="libraries to preload ('' or 'glibc' = none)")
    a = ap.parse_args()
    libs = [("" if x in ("", "glibc") else os.path.abspath(x)) for x in a.libs] or [
        "", os.path.join(ROOT, "target", "release", "libmemshim.so")]
    missing = [lib for lib in libs if lib and not os.path.isfile(lib)]
    if missing:
        raise SystemExit(f"execcost: no such library: {', '.join(missing)}")
    cases = [("/bin/true", ["/bin/true"], a.runs), ("python3 -c pass", [real_python(), "-c", "pass"],
                                                    max(10, a.runs // 10))]
    print(f"{'command':16s} {'library':34s} {'instructions':>13s} {'vs glibc':>10s} {'faults':>7s} "
          f"{'syscalls':>8s} {'cpu µs':>8s}")
    for label, argv, runs in cases:
        fc = faults_and_cpu(argv, libs, runs)
        base = None
        for lib in libs:
            ins = instructions(argv, lib)
            if lib == libs[0]:
                base = ins
            sc = syscalls(argv, lib)
            name = os.path.relpath(lib, ROOT) if lib.startswith(ROOT) else (lib or "glibc (no preload)")
            d = "–" if ins is None or base is None or lib == libs[0] else f"{ins - base:+,}"
            print(f"{label:16s} {name[-34:]:34s} {ins or 0:>13,} {d:>10s} {fc[lib][0]:>7.0f} "
                  f"{'–' if sc is None else sc:>8} {fc[lib][1]:>8.0f}")
    print(f"\n{'bash loop of /bin/true':34s} {'faults/iteration: all':>22s} {'exec only':>10s} {'shell':>6s}")
    loop = shell_loop_faults(libs, max(3, a.runs // 40))
    for lib in libs:
        name = os.path.relpath(lib, ROOT) if lib.startswith(ROOT) else (lib or "glibc (no preload)")
        every, child = loop[lib]
        print(f"{name[-34:]:34s} {every:>22.1f} {child:>10.1f} {every - child:>6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
