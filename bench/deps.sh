#!/usr/bin/env bash
# Installs what `make bench` compares against and measures with.
# Idempotent: packages already present are not fetched again.
#   Debian: libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0 (comparison allocators), gcc, hyperfine (optional)
#   anchors: the newest allocators on crates.io (mimalloc v3 and v2, jemalloc 5.3.1), built from the
#           crates' bundled sources into bench/out/anchors/ (bench/benchlib/anchors.py; needs cargo, cc, make)
#   pip:    numpy (scenario 1 fallback workload) for the python3 the harness uses,
#           pyperformance in its own venv under bench/out/pyperf-venv (scenario 5),
#           and the benchmarks' venv it creates, so that `make bench` runs offline afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0 gcc hyperfine)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
else
    echo "bench-deps: Debian packages already installed: ${pkgs[*]}"
fi

PY=$(python3 -c 'import sys; print(sys.executable)')
"$PY" bench/benchlib/anchors.py || echo "bench-deps: some registry anchors are missing (see above); the runs report them as missing"

if ! "$PY" -c 'import numpy' 2>/dev/null; then
    "$PY" -m pip install --quiet numpy
fi

VENV=bench/out/pyperf-venv
if [ ! -x "$VENV/bin/pyperformance" ]; then
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip
    "$VENV/bin/pip" install --quiet pyperformance
fi
echo "bench-deps: pyperformance $("$VENV/bin/pyperformance" --version 2>/dev/null || echo missing) in $VENV"
echo "bench-deps: numpy $("$PY" -c 'import numpy; print(numpy.__version__)')"
"$PY" -c 'import torch, transformers' 2>/dev/null \
    && echo "bench-deps: torch + transformers importable (scenario 1 uses a real BertModel)" \
    || echo "bench-deps: torch/transformers not importable (scenario 1 uses its numpy fallback); see tests/ for the torch install"
