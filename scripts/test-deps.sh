#!/usr/bin/env bash
# Installs what `make test` needs and this machine lacks; `make test` runs it
# first (`make test-deps` alone also works). Idempotent: what is present is
# not fetched again, and a machine that has everything makes no network call.
#
#   Debian packages  compilers and tools the tests run (cc, strace, socat,
#                    bubblewrap, valgrind, prometheus's promtool), the
#                    comparison allocators of the benchmark smoke run,
#                    python3-venv (the wheel tests' venvs), qemu-user-static
#                    and an arm64 glibc (the aarch64 smoke test),
#                    qemu-system-x86 and e2fsprogs (the cgroup v2 test VMs),
#                    golang-go (`go tool pprof` reads the pprof profiles),
#                    chromium (the flame graph, clicked and searched headless).
#   rustup target    aarch64-unknown-linux-gnu (the aarch64 wheel); where
#                    rustup cannot fetch it, the aarch64 parts say SKIP.
#   Debian sid root  CPython 3.13, 3.14 and 3.15 as Debian sid ships them,
#                    with Debian's torch for 3.14, in a root filesystem
#                    built once with debootstrap (as root only) and cached
#                    outside the checkout; where it cannot be built, the
#                    tests that use it say SKIP with the reason.
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
          prometheus hyperfine valgrind qemu-user-static libc6-arm64-cross
          qemu-system-x86 e2fsprogs golang-go chromium)
# debootstrap builds the Debian sid root below, which only root can build and
# enter: not asked of other users (their sid tests say SKIP).
[ "$(id -u)" = 0 ] && apt_pkgs+=(debootstrap)
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
# test-torch) and the model-cycle benchmark; fastapi + uvicorn for the
# model server test of a process started without the preload. PyPI only has torch's CUDA
# build for x86_64 (several GiB with its nvidia-* packages; the tests use the
# CPU and never initialise CUDA); pip's cache keeps re-runs fast.
# Pinned to the versions the tests were last checked with, so that a fresh
# machine does not pick up a release that warns or allocates differently.
py_pins=(torch==2.15.0 transformers==5.23.0 numpy==2.4.6 fastapi==0.165.0 uvicorn==0.55.0)
PY=$(python3 -c 'import sys; print(sys.executable)')
if "$PY" -c 'import torch, transformers, numpy, fastapi, uvicorn' >/dev/null 2>&1; then
    say "torch, transformers, numpy, fastapi, uvicorn importable by $PY"
elif [ "$dry" = 1 ]; then
    say "missing for $PY: torch transformers numpy fastapi uvicorn"
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

# --- Debian sid root: the CPythons users run ---------------------------------------------
# The python family (tests/tests/python/) runs Debian sid's python3.13, python3.14 and python3.15
# besides pyenv's 3.8-3.13.0 (tests/src/sid.rs). This machine cannot run
# sid's binaries (its glibc is older), so they live in a root filesystem of
# their own, which the tests enter with chroot from a mount namespace of the
# test's child: debootstrap's minbase with the three interpreters, their
# -venv packages, pip, libpython3.X (the embedder tests), and Debian's
# python3-torch and python3-transformers (the BERT test). Debian builds torch
# for sid's default python3 only (3.14 today), and for the CPU: a few hundred
# MiB against the several GiB of PyPI's CUDA wheels, and what a CPU-only CI
# exercises anyway. About 3 min and 2.5 GB, once: it is kept outside the
# checkout (a fresh clone reuses it), built in a temporary directory and
# renamed into place only when complete, with a manifest of what it holds
# (memshim-manifest, inside it), so a later run only reads that. It is built
# again when the recipe below changes; remove it to take a newer sid. Where it
# cannot be built (not root, no registry, debootstrap fails), `make test`
# goes on: the reason goes to debian-sid.unavailable beside it, and the tests
# that need the root say SKIP with that reason.
sid_cache=${MEMSHIM_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/memshim}
sid_root=$sid_cache/debian-sid
sid_unavailable=$sid_root.unavailable
sid_log=$sid_root.log
sid_mirror=http://deb.debian.org/debian
sid_base=(python3.13 python3.14 python3.15 python3-pip)
sid_more=(libpython3.13 libpython3.14 libpython3.15 python3.13-venv python3.14-venv python3.15-venv
          python3-torch python3-transformers)
# What the root is built from; a root whose manifest names another is rebuilt.
sid_recipe=$(printf '%s\n' 1 sid "$sid_mirror" "${sid_base[*]}" "${sid_more[*]}" | sha256sum | cut -c1-16)

# The root could not be had: say why, and keep the reason for the tests'
# SKIP lines.
sid_skip() {
    say "Debian sid root unavailable: $*"
    say "  (the tests that run sid's CPythons will SKIP; the reason is kept in $sid_unavailable)"
    { mkdir -p "$sid_cache" \
        && printf '%s (scripts/test-deps.sh, %s)\n' "$*" "$(date -u +%FT%TZ)" >"$sid_unavailable"; } 2>/dev/null \
        || true
}

# sid_in_root ROOT CMD...: CMD chrooted into ROOT with a clean environment,
# /proc, /dev and /sys bound inside it, in a mount namespace of its own
# (every mount goes with it), killed after $sid_timeout seconds.
sid_in_root() {
    local r=$1
    shift
    timeout "${sid_timeout:-300}" unshare -m --propagation private -- sh -c '
        r=$1; shift
        for m in proc dev sys; do mount --rbind "/$m" "$r/$m" || exit 125; done
        exec chroot "$r" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
            LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"' sh "$r" "$@"
}

# The manifest's value of KEY, or nothing.
sid_manifest() {
    sed -n "s/^$1=//p" "$sid_root/memshim-manifest" 2>/dev/null | head -n 1
}

sid_present() {
    [ -f "$sid_root/memshim-manifest" ] && [ "$(sid_manifest recipe)" = "$sid_recipe" ]
}

# Builds the root in the empty directory $1, writing what it runs to stderr
# and the commands' output to $sid_log. On failure, prints why (one line) on
# stdout and returns 1.
sid_build() {
    local tmp=$1 rc v ver py torch
    local include
    include=$(IFS=,; echo "${sid_base[*]}")
    say "debootstrap --variant=minbase --include=$include sid $tmp $sid_mirror" >&2
    timeout 1200 unshare -m --propagation private -- \
        debootstrap --variant=minbase --include="$include" sid "$tmp" "$sid_mirror" >>"$sid_log" 2>&1 || {
        rc=$?
        echo "debootstrap failed (exit $rc): $(grep -E '^(E|W): ' "$sid_log" | tail -n 1)"
        return 1
    }
    # apt in the root resolves the mirror's name with the root's resolv.conf;
    # debootstrap copies the host's, unless that is a link.
    [ -f "$tmp/etc/resolv.conf" ] || cp -L /etc/resolv.conf "$tmp/etc/resolv.conf" 2>/dev/null || true
    say "chroot $tmp apt-get install --no-install-recommends ${sid_more[*]}" >&2
    sid_timeout=1500 sid_in_root "$tmp" apt-get install -y -q --no-install-recommends "${sid_more[@]}" \
        >>"$sid_log" 2>&1 || {
        rc=$?
        echo "apt-get install in the root failed (exit $rc): $(grep -E '^(E|W): ' "$sid_log" | tail -n 1)"
        return 1
    }
    sid_in_root "$tmp" apt-get clean >>"$sid_log" 2>&1 || true
    # What it holds, found by running it: each interpreter and its
    # libpython, and torch with transformers under sid's default python3.
    say "checking the root: python3.13, python3.14, python3.15, libpython, torch" >&2
    {
        echo "# memshim's Debian sid test root (scripts/test-deps.sh); tests/src/sid.rs reads it"
        echo "recipe=$sid_recipe"
        echo "built=$(date -u +%FT%TZ)"
        echo "suite=sid $sid_mirror"
    } >"$tmp/memshim-manifest"
    for v in 3.13 3.14 3.15; do
        ver=$(sid_in_root "$tmp" "/usr/bin/python$v" -c 'import platform; print(platform.python_version())' \
            2>>"$sid_log") || { echo "python$v does not run in the root"; return 1; }
        compgen -G "$tmp/usr/lib/*/libpython$v.so.1.0" >/dev/null \
            || { echo "libpython$v.so.1.0 is missing from the root"; return 1; }
        echo "python$v=$ver" >>"$tmp/memshim-manifest"
    done
    py=$(basename "$(readlink "$tmp/usr/bin/python3")")
    torch=$(sid_in_root "$tmp" "/usr/bin/$py" -c \
        'import torch, transformers; print(torch.__version__, transformers.__version__)' 2>>"$sid_log") \
        || { echo "torch or transformers does not import under $py in the root"; return 1; }
    {
        echo "torch=${torch% *}"
        echo "torch_python=${py#python}"
        echo "transformers=${torch#* }"
        echo "build_seconds=$((SECONDS - sid_started))"
    } >>"$tmp/memshim-manifest"
}

if sid_present; then
    say "Debian sid root present: $sid_root (built $(sid_manifest built); python $(sid_manifest python3.13)," \
        "$(sid_manifest python3.14), $(sid_manifest python3.15); torch $(sid_manifest torch) for python$(sid_manifest torch_python))"
    rm -f "$sid_unavailable"
elif [ "$dry" = 1 ]; then
    say "missing: the Debian sid root $sid_root (debootstrap, as root: about 3 min and 2.5 GB)"
elif [ "$(id -u)" != 0 ]; then
    sid_skip "not built: scripts/test-deps.sh ran as uid $(id -u), and only root can debootstrap it and the tests enter it (unshare, chroot)"
elif ! command -v debootstrap >/dev/null 2>&1; then
    sid_skip "not built: debootstrap is not installed"
elif ! mkdir -p "$sid_cache" 2>/dev/null; then
    sid_skip "not built: cannot create $sid_cache"
elif [ "$(df -Pk "$sid_cache" | awk 'NR == 2 { print int($4 / 1048576) }')" -lt 5 ]; then
    sid_skip "not built: less than 5 GiB free in $sid_cache (the root takes 2.5 GB, its packages as much again while it is built)"
else
    # A subshell of its own, with its own `set -e` (one on the left of `||`
    # would run with errexit ignored): whatever stops it, make test goes on.
    set +e
    (
        set -e
        # Low priority for everything it runs; one build at a time (a second
        # `make test` waits for the first's, then finds the root there).
        renice -n 19 -p "$BASHPID" >/dev/null
        ionice -c 2 -n 7 -p "$BASHPID" 2>/dev/null || true
        exec 9>"$sid_root.lock"
        flock 9
        sid_present && exit 0
        # What an interrupted build left (its mounts died with its namespace).
        for t in "$sid_root".tmp.*; do
            if [ -d "$t" ]; then rm -rf --one-file-system "$t"; fi
        done
        sid_started=$SECONDS
        tmp=$(mktemp -d "$sid_root.tmp.XXXXXX")
        chmod 755 "$tmp"
        : >"$sid_log"
        say "building the Debian sid root at $sid_root (once; about 3 min and 2.5 GB; at low priority; log: $sid_log)"
        if why=$(sid_build "$tmp"); then
            if [ -d "$sid_root" ]; then mv "$sid_root" "$tmp.old"; fi
            mv "$tmp" "$sid_root"
            rm -rf --one-file-system "$tmp.old"
            rm -f "$sid_unavailable"
            say "Debian sid root built in $((SECONDS - sid_started)) s:" \
                "$(grep -E '^(python3\.1[0-9]|torch|torch_python|transformers)=' "$sid_root/memshim-manifest" | tr '\n' ' ')"
        else
            tail -n 15 "$sid_log" | sed 's/^/    /'
            rm -rf --one-file-system "$tmp"
            sid_skip "not built: $why (log: $sid_log)"
        fi
    )
    rc=$?
    set -e
    [ "$rc" = 0 ] || sid_skip "not built: the build stopped (exit $rc; log: $sid_log)"
fi

# --- the wheel build's tools (zig, cargo-zigbuild, auditwheel) --------------------------
if [ "$dry" != 1 ]; then
    make -s tools
fi
[ "$dry" = 1 ] || bash scripts/vm-image.sh  # the cgroup v2 VMs' kernels (never fails)
say "done"
