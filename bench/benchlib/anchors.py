"""Builds the newest registry allocators as preloadable libraries (comparison anchors).

bench/anchors/Cargo.toml pins crates whose packages carry allocator C sources:
libmimalloc-sys (mimalloc v3 and v2) and tikv-jemalloc-sys (jemalloc 5.3.1, the
release memshim links). `cargo fetch` brings them into cargo's registry; this
module compiles them into bench/out/anchors/ with the system C compiler:

  libmimalloc3.so     mimalloc v3, malloc overridden (MI_MALLOC_OVERRIDE), release build
  libmimalloc2.so     mimalloc v2, the same
  libjemalloc531.so   jemalloc 5.3.1 from its own configure, unprefixed, its defaults

Nothing is committed; a rebuild happens when the lock file changes. Used by
`make bench-deps` (python3 bench/benchlib/anchors.py) and looked up by configs.py.
Stdlib only. A failure is reported and leaves that anchor missing, never more."""

import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MANIFEST = os.path.join(ROOT, "bench", "anchors", "Cargo.toml")
LOCK = os.path.join(ROOT, "bench", "anchors", "Cargo.lock")
OUT = os.path.join(ROOT, "bench", "out", "anchors")

# name -> (file, label); configs.py reads this table.
ANCHORS = {
    "mimalloc3": ("libmimalloc3.so", "mimalloc v3 from crates.io libmimalloc-sys (built by bench/anchors)"),
    "mimalloc2": ("libmimalloc2.so", "mimalloc v2 from crates.io libmimalloc-sys (built by bench/anchors)"),
    "jemalloc531": ("libjemalloc531.so", "jemalloc 5.3.1 (memshim's release) with its own defaults, unprefixed "
                                         "(built by bench/anchors)"),
}


def path(name):
    return os.path.join(OUT, ANCHORS[name][0])


def _log(msg):
    print(f"anchors: {msg}", file=sys.stderr, flush=True)


def _sources():
    """{crate name: (version, source dir)} of the pinned crates, fetching them if needed."""
    subprocess.run(["cargo", "fetch", "--manifest-path", MANIFEST, "--locked"], check=True,
                   stdout=subprocess.DEVNULL)
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--manifest-path", MANIFEST, "--format-version", "1", "--locked"],
        check=True, capture_output=True, text=True).stdout)
    return {p["name"]: (p["version"], os.path.dirname(p["manifest_path"])) for p in meta["packages"]}


def _fresh(out):
    return os.path.exists(out) and os.path.getmtime(out) >= os.path.getmtime(LOCK)


def _mimalloc(src, flavour, out):
    """One translation unit (src/static.c), as mimalloc's own shared build does."""
    base = os.path.join(src, "c_src", "mimalloc", flavour)
    cc = os.environ.get("CC", "cc")
    cmd = [cc, "-O3", "-DNDEBUG", "-DMI_DEBUG=0", "-DMI_MALLOC_OVERRIDE", "-DMI_SHARED_LIB",
           "-DMI_SHARED_LIB_EXPORT", "-fPIC", "-shared", "-ftls-model=initial-exec", "-fvisibility=hidden",
           "-Wno-error=date-time", "-I", os.path.join(base, "include"), "-I", os.path.join(base, "src"),
           os.path.join(base, "src", "static.c"), "-o", out + ".tmp", "-lpthread"]
    subprocess.run(cmd, check=True)
    os.replace(out + ".tmp", out)


def _jemalloc(src, version, out):
    """jemalloc's configure + make of the shared library, outside the source tree."""
    build = os.path.join(OUT, "jemalloc-build")
    shutil.rmtree(build, ignore_errors=True)
    shutil.copytree(os.path.join(src, "jemalloc"), build)
    shutil.copy(os.path.join(src, "configure", "configure"), os.path.join(build, "configure"))
    je_version = version.split("+", 1)[1] if "+" in version else version
    subprocess.run(["sh", "configure", f"--with-version={je_version}", "--disable-cxx", "--enable-doc=no",
                    "--disable-static", "--disable-prof"], cwd=build, check=True,
                   stdout=subprocess.DEVNULL)
    jobs = str(max(1, min(4, os.cpu_count() or 1)))
    subprocess.run(["make", "-j", jobs, "build_lib_shared"], cwd=build, check=True, stdout=subprocess.DEVNULL)
    lib = os.path.join(build, "lib", "libjemalloc.so.2")
    shutil.copy(lib, out + ".tmp")
    os.replace(out + ".tmp", out)
    shutil.rmtree(build, ignore_errors=True)


def build_anchors(only=None):
    """Builds what is missing or stale; returns {name: path} of the anchors that exist."""
    os.makedirs(OUT, exist_ok=True)
    want = [n for n in ANCHORS if only is None or n in only]
    if any(not _fresh(path(n)) for n in want):
        if shutil.which("cargo") is None:
            _log("cargo not found: the registry anchors are not built")
            return {n: path(n) for n in want if os.path.exists(path(n))}
        try:
            src = _sources()
        except (subprocess.CalledProcessError, OSError, ValueError) as e:
            _log(f"cannot fetch the anchor sources ({e}); they stay missing")
            return {n: path(n) for n in want if os.path.exists(path(n))}
        steps = {
            "mimalloc3": lambda o: _mimalloc(src["libmimalloc-sys"][1], "v3", o),
            "mimalloc2": lambda o: _mimalloc(src["libmimalloc-sys"][1], "v2", o),
            "jemalloc531": lambda o: _jemalloc(src["tikv-jemalloc-sys"][1], src["tikv-jemalloc-sys"][0], o),
        }
        for n in want:
            if _fresh(path(n)):
                continue
            _log(f"building {ANCHORS[n][0]}")
            try:
                steps[n](path(n))
            except (subprocess.CalledProcessError, OSError, KeyError) as e:
                _log(f"{n} failed to build ({e}); it stays missing")
    return {n: path(n) for n in want if os.path.exists(path(n))}


if __name__ == "__main__":
    built = build_anchors(set(sys.argv[1:]) or None)
    for n, p in built.items():
        print(f"anchors: {n}: {os.path.relpath(p, ROOT)}")
    sys.exit(0 if built else 1)
