#!/usr/bin/env python3
"""Where the page faults of one exec land: by object and ELF section, side by side per preload.

  python3 bench/startfaults.py [--runs N] [--cmd /bin/true] [LIB ...]
      (default: no preload, this checkout's cargo and two wheel builds of libmemshim.so)

Each exec runs under `perf record -e page-faults -c 1 -d` (every fault, with its data address);
the address is placed in the mapping it fell in (perf's mmap events) and, for a file, in the
section of that file that holds it (readelf); the preloaded library is "PRELOAD". Faults on anonymous memory (.bss past the file,
the heap, TLS blocks, the loader's own allocations) are "//anon". The count per row is the median
over N runs. Needs `perf` and `readelf`; root, or perf_event_paranoid <= 1.
bench/FINDINGS-startup.md reads this table.

  python3 bench/startfaults.py --fork N [--runs R] [LIB ...]

A shell's fork and exec instead: `bash -c 'for i in $(seq N); do /bin/true; done'` with every
process preloaded, its faults per iteration by process (the shell; each fork child before it execs,
which runs the fork child handlers and whatever the shell does there; the exec'd `/bin/true`), then
the shell's and the fork child's by object and section, per iteration. The shell's are mostly
copy-on-write faults: each fork write-protects its pages, so every page it writes between two forks
faults again. Medians of R runs.

  --conf OPTS sets MEMSHIM_MALLOC_CONF=OPTS in every process, for trying jemalloc's options."""

import argparse
import collections
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MMAP = re.compile(r"PERF_RECORD_MMAP2 \d+/\d+: \[0x([0-9a-f]+)\(0x([0-9a-f]+)\) @ (0x[0-9a-f]+|0) .*?\]: \S+ (.*)$")
_sections = {}


def sections(path):
    """(name, vaddr, size) of the allocated sections of an ELF file."""
    if path not in _sections:
        out = subprocess.run(["readelf", "-SW", path], capture_output=True, text=True).stdout
        rows = []
        for line in out.splitlines():
            m = re.match(r"\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)", line)
            if m and int(m.group(2), 16):
                rows.append((m.group(1), int(m.group(2), 16), int(m.group(3), 16)))
        _sections[path] = rows
    return _sections[path]


CONF = {}


def record(cmd, lib):
    """`perf script` lines (comm, pid, addr, and the mmap events) of one run of `cmd` under `lib`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_PRELOAD", "MEMSHIM_"))}
    env.update(CONF)
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "perf.data")
        pre = ["env", f"LD_PRELOAD={lib}"] if lib else ["env"]
        subprocess.run(["perf", "record", "-q", "-e", "page-faults", "-c", "1", "-d", "-o", data] + pre + cmd,
                       env=env, capture_output=True, check=True)
        out = subprocess.run(["perf", "script", "-i", data, "-F", "comm,pid,addr", "--show-mmap-events"],
                             capture_output=True, text=True).stdout
    return [line.split() for line in out.splitlines() if line.split()]


def place(addr, maps, first, lib):
    """'object section' (or the mapping's name) of a faulting address."""
    for start, size, path in reversed(maps):
        if start <= addr < start + size:
            if path.startswith("/") and os.path.isfile(path):
                off = addr - first[path]
                sec = next((n for n, a, s in sections(path) if a <= off < a + max(s, 1)), "?")
                name = "PRELOAD" if lib and os.path.realpath(path) == os.path.realpath(lib) else \
                    os.path.basename(path)
                return f"{name} {sec}"
            return path
    return "?"


def add_map(line, maps, first):
    m = MMAP.search(" ".join(line))
    if m:
        start, size, path = int(m.group(1), 16), int(m.group(2), 16), m.group(4).strip()
        maps.append((start, size, path))
        first.setdefault(path, start)
    return bool(m)


def one_exec(cmd, lib, comm):
    """Counter of (object, section) for the faults of one run of `cmd`."""
    maps, first, got = [], {}, collections.Counter()
    for words in record(cmd, lib):
        if words[0] != comm or add_map(words, maps, first) or len(words) < 3:
            continue
        got[place(int(words[2], 16), maps, first, lib)] += 1
    return got


def fork_loop(n, lib):
    """Faults of a shell loop of `n` execs: (Counter by process role, Counters of the shell's and of
    the fork children's faults by object and section). A fork child uses the shell's mappings until
    it execs."""
    cmd = ["bash", "-c", f"for i in $(seq {n}); do /bin/true; done"]
    shell, maps, first = None, [], {}
    roles, parent, child = collections.Counter(), collections.Counter(), collections.Counter()
    for words in record(cmd, lib):
        if len(words) < 3 or words[0] not in ("env", "bash", "true"):
            continue
        comm, pid = words[0], words[1]
        if shell is None and comm in ("env", "bash"):
            shell = pid
        if "PERF_RECORD_MMAP2" in words[2]:
            if pid == shell:
                add_map(words, maps, first)
            continue
        if pid == shell:
            roles["shell"] += 1
            parent[place(int(words[2], 16), maps, first, lib)] += 1
        elif comm == "bash":
            roles["fork child"] += 1
            child[place(int(words[2], 16), maps, first, lib)] += 1
        else:
            roles["exec"] += 1
    return roles, parent, child


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cmd", default="/bin/true")
    ap.add_argument("--fork", type=int, metavar="N", help="a shell loop of N execs instead (module docs)")
    ap.add_argument("--conf", metavar="OPTS",
                    help="MEMSHIM_MALLOC_CONF for every process (which then initialises jemalloc at start-up: "
                         "only the shell's own figures compare with a run without it)")
    ap.add_argument("libs", nargs="*", help="libraries to preload ('' or 'glibc' = none)")
    a = ap.parse_args()
    if a.conf:
        CONF["MEMSHIM_MALLOC_CONF"] = a.conf
    libs = [("" if x in ("", "glibc") else os.path.abspath(x)) for x in a.libs] or [
        "", os.path.join(ROOT, "target", "release", "libmemshim.so"),
        os.path.join(ROOT, "target", "glibc2.34", "x86_64-unknown-linux-gnu", "release", "libmemshim.so"),
        os.path.join(ROOT, "target", "x86_64-unknown-linux-gnu", "release", "libmemshim.so")]
    missing = [lib for lib in libs if lib and not os.path.isfile(lib)]
    if missing:
        raise SystemExit(f"startfaults: no such library: {', '.join(missing)}")
    names = [os.path.relpath(lib, ROOT)[-28:] if lib.startswith(ROOT) else (os.path.basename(lib) or "no preload")
             for lib in libs]
    if a.fork:
        runs = {lib: [fork_loop(a.fork, lib) for _ in range(a.runs)] for lib in libs}
        print(f"{'faults per iteration, by process':44s}" + "".join(f"{n[-28:]:>30s}" for n in names))
        for role in ("shell", "fork child", "exec"):
            print(f"{role:44s}" + "".join(
                f"{statistics.median(r[0][role] for r in runs[lib]) / a.fork:>30.2f}" for lib in libs))
        for i, who in ((1, "the shell"), (2, "the fork child")):
            print(f"\n{who + ', per iteration: object section':44s}" + "".join(f"{n[-28:]:>30s}" for n in names))
            table({lib: [r[i] for r in rs] for lib, rs in runs.items()}, libs, a.fork)
    else:
        cmd = a.cmd.split()
        comm = os.path.basename(os.path.realpath(cmd[0]))[:15]
        runs = {lib: [one_exec(cmd, lib, comm) for _ in range(a.runs)] for lib in libs}
        print(f"{'object section':44s}" + "".join(f"{n[-28:]:>30s}" for n in names))
        table(runs, libs, 1)
    return 0


def table(runs, libs, scale):
    """Rows of faults by object and section, medians over runs / scale, biggest first, and the total."""
    rows = sorted({k for r in runs.values() for c in r for k in c})
    med = {lib: {k: statistics.median(c[k] for c in r) / scale for k in rows} for lib, r in runs.items()}
    rows.sort(key=lambda k: -max(med[lib][k] for lib in libs))
    for k in rows:
        vals = [med[lib][k] for lib in libs]
        if any(v >= 0.05 for v in vals):
            print(f"{k[:44]:44s}" + "".join(f"{v:>30.3g}" for v in vals))
    print(f"{'total (median of sums)':44s}" + "".join(
        f"{statistics.median(sum(c.values()) for c in runs[lib]) / scale:>30.3g}" for lib in libs))


if __name__ == "__main__":
    sys.exit(main())
