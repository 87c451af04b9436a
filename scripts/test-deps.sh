#!/usr/bin/env bash
# Installs what `make test` needs and this machine lacks; `make test` runs it
# first (`make test-deps` alone also works). Idempotent: what is present is
# not fetched again, and a machine that has everything makes no network call.
#
#   Debian packages  compilers and tools the tests run (cc, strace, socat,
#                    bubblewrap, valgrind, prometheus's promtool), the
#                    comparison allocators of the benchmark smoke run,
#                    python3-venv (the wheel tests' venvs), qemu-user-static
#                    and an arm64 glibc (the aarch64 smoke test).
#   rustup target    aarch64-unknown-linux-gnu (the aarch64 wheel); where
#                    rustup cannot fetch it, the aarch64 parts say SKIP.
#   PyPI             torch, transformers, numpy for the PyTorch bridge tests;
#                    zig, cargo-zigbuild and auditwheel for the wheels (into
#                    .tools/venv, through `make tools`).
#
# Not root: missing Debian packages are installed with sudo if it runs
# without a password, else listed with the command to run. MEMSHIM_NO_INSTALL=1
# only reports what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "test-deps: $*"; }
dry=${MEMSHIM_NO_INSTALL:-0}

# --- Debian packages -----------------------------------------------------------
apt_pkgs=(build-essential binutils git make python3 python3-venv python3-pip procps util-linux
          iproute2 strace socat bubblewrap libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0
          prometheus hyperfine valgrind qemu-user-static libc6-arm64-cross)
missing=()
for p in "${apt_pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    if [ "$dry" = 1 ]; then
        say "missing Debian packages: ${missing[*]}"
    else
        SUDO=()
        if [ "$(id -u)" != 0 ]; then
            if sudo -n true 2>/dev/null; then
                SUDO=(sudo -n)
            else
                say "missing Debian packages: ${missing[*]}" >&2
                say "run: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
                exit 1
            fi
        fi
        say "apt-get install ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        "${SUDO[@]}" apt-get update -qq
        "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
else
    say "Debian packages present"
fi

# --- Rust ------------------------------------------------------------------------
if ! command -v cargo >/dev/null 2>&1; then
    say "error: cargo not found; install a Rust toolchain (https://rustup.rs) first" >&2
    exit 1
fi
if command -v rustup >/dev/null 2>&1; then
    if rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu; then
        say "rustup target aarch64-unknown-linux-gnu present"
    elif [ "$dry" != 1 ]; then
        say "rustup target add aarch64-unknown-linux-gnu"
        rustup target add aarch64-unknown-linux-gnu \
            || say "rustup could not add aarch64-unknown-linux-gnu: the aarch64 wheel and its smoke test will SKIP"
    fi
fi

# --- Python packages -----------------------------------------------------------------
# torch + transformers for the PyTorch bridge tests (`make test` runs
# test-torch) and the model-cycle benchmark. PyPI only has torch's CUDA
# build for x86_64 (several GiB with its nvidia-* packages; the tests use the
# CPU and never initialise CUDA); pip's cache keeps re-runs fast.
# Pinned to the versions the tests were last checked with, so that a fresh
# machine does not pick up a release that warns or allocates differently.
py_pins=(torch==2.15.0 transformers==5.23.0 numpy==2.4.6)
PY=$(python3 -c 'import sys; print(sys.executable)')
if "$PY" -c 'import torch, transformers, numpy' >/dev/null 2>&1; then
    say "torch, transformers, numpy importable by $PY"
elif [ "$dry" = 1 ]; then
    say "missing for $PY: torch transformers numpy"
else
    say "pip install ${py_pins[*]} (for $PY)"
    pip_args=(-q)
    # Debian's own python3 refuses system-wide pip installs (PEP 668).
    "$PY" -m pip install --help 2>/dev/null | grep -q -- --break-system-packages \
        && [ -e "$("$PY" -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')/EXTERNALLY-MANAGED" ] \
        && pip_args+=(--break-system-packages)
    for attempt in 1 2 3; do
        if "$PY" -m pip install "${pip_args[@]}" "${py_pins[@]}"; then break; fi
        [ "$attempt" = 3 ] && exit 1
        say "pip install failed (attempt $attempt), retrying" >&2
        sleep 10
    done
fi

# --- the wheel build's tools (zig, cargo-zigbuild, auditwheel) --------------------------
if [ "$dry" != 1 ]; then
    make -s tools
fi
[ "$dry" = 1 ] || bash scripts/vm-image.sh  # the cgroup v2 VMs' kernels (never fails)
say "done"
