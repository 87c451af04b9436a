#!/usr/bin/env bash
# Builds the kernels and initramfs of the test VMs, which run the cgroup
# tests on a live cgroup v2 kernel (tests/tests/cgroup_vm.rs; how the VMs
# are made: tests/vm/README.md). scripts/test-deps.sh runs it; it is
# idempotent: once everything is cached it makes no network call.
#
#   bookworm  Debian 12's kernel (6.1), the kernel of the oldest hosts we
#             support with cgroup v2.
#   newest    the newest Debian kernel that boots here: the first of
#             $MEMSHIM_VM_NEWEST_SUITES (default: sid forky trixie
#             bookworm-backports) whose kernel passes a boot check.
#
# For each: the kernel packages are fetched with apt-get (a private sources
# list on this machine's Debian mirror, private lists: the system's apt
# state is not touched), the uncompressed vmlinux is taken out of the
# bzImage (tests/vm/vmlinux.py: QEMU boots it through its PVH entry, much
# faster than the bzImage under emulation), and the initramfs is the static
# init (tests/vm/init.c) followed by the modules it needs to mount its root
# (tests/vm/mkinitramfs.py). The kernel then boots once to run /bin/true.
#
# Cached outside the checkout, in $MEMSHIM_CACHE_DIR, else
# ${XDG_CACHE_HOME:-~/.cache}/memshim, under vm/:
#   vm/<kernel-version>/   vmlinux, initramfs, modules.cpio, kernel, suite,
#                          package, boot-check.log
#   vm/bookworm, vm/newest links to the kernel directory of each role
#   vm/<role>.skip         why that role has no kernel (the tests print it
#                          as their SKIP reason); vm/all.skip: why none has
#   vm/init/               the init, built from tests/vm/init.c, and its
#                          archive; rebuilt (with every initramfs, no
#                          network) when init.c or mkinitramfs.py changes.
#
# Never fails (exit 0): what cannot be had (QEMU, a mirror, a kernel that
# boots) is written to the .skip files instead. Runs at low priority.
# MEMSHIM_NO_INSTALL=1: no apt-get install of QEMU (only a report).
# MEMSHIM_VM_REFRESH=1: look for newer kernels again.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

if [ -z "${MEMSHIM_VM_IMAGE_NICE:-}" ]; then
    export MEMSHIM_VM_IMAGE_NICE=1
    pre=(nice -n 19)
    command -v ionice >/dev/null 2>&1 && ionice -c 3 true 2>/dev/null && pre+=(ionice -c 3)
    exec "${pre[@]}" bash "$0" "$@"
fi

CACHE=${MEMSHIM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/memshim}/vm
MODULES=(virtio_pci virtio_blk 9pnet_virtio 9p overlay ext4)
NEWEST_SUITES=(${MEMSHIM_VM_NEWEST_SUITES:-sid forky trixie bookworm-backports})
# What the boot check and tests/src/vm.rs put on the kernel's command line.
# no_timer_check: on a loaded machine an emulated CPU is too slow for the
# kernel's IO-APIC timer check, which then panics at boot.
CMDLINE="console=ttyS0 panic=-1 quiet mitigations=off no_timer_check"
T0=$(date +%s)

say() { echo "vm-image: [$(($(date +%s) - T0))s] $*"; }
skip() { # skip ROLE REASON: the tests of ROLE say SKIP with REASON
    mkdir -p "$CACHE"
    printf '%s\n' "$2" >"$CACHE/$1.skip"
    say "SKIP $1: $2"
}
finish() { say "done"; exit 0; }

mkdir -p "$CACHE" || { echo "vm-image: cannot make $CACHE; the VM tests will SKIP"; exit 0; }

# --- tools ----------------------------------------------------------------------
if ! command -v qemu-system-x86_64 >/dev/null 2>&1 && [ "${MEMSHIM_NO_INSTALL:-0}" != 1 ] \
    && command -v apt-get >/dev/null 2>&1; then
    SUDO=()
    [ "$(id -u)" = 0 ] || SUDO=(sudo -n)
    if [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; then
        say "apt-get install qemu-system-x86"
        export DEBIAN_FRONTEND=noninteractive
        { "${SUDO[@]}" apt-get install -y -qq --no-install-recommends qemu-system-x86 >/dev/null 2>&1 \
            || { "${SUDO[@]}" apt-get update -qq && "${SUDO[@]}" apt-get install -y -qq \
                --no-install-recommends qemu-system-x86 >/dev/null; }; } \
            || say "apt-get install qemu-system-x86 failed"
    fi
fi
missing=()
for t in qemu-system-x86_64 gcc python3 apt-get apt-cache dpkg-deb tar mkfs.ext4; do
    command -v "$t" >/dev/null 2>&1 || missing+=("$t")
done
if ((${#missing[@]})); then
    skip all "missing here: ${missing[*]} (on Debian: apt-get install qemu-system-x86 build-essential python3 e2fsprogs)"
    finish
fi
rm -f "$CACHE/all.skip"

# --- the init ---------------------------------------------------------------------
# Shared by every kernel; its stamp (a hash of the sources of the init and
# the initramfs, and of this script, whose boot check it passed) says when
# the kernels' initramfs must be put together and checked again.
INIT_DIR=$CACHE/init
STAMP=$(cat tests/vm/init.c tests/vm/mkinitramfs.py scripts/vm-image.sh | sha256sum | cut -c1-16)
if [ "$(cat "$INIT_DIR/stamp" 2>/dev/null)" != "$STAMP" ]; then
    say "building the init (tests/vm/init.c, gcc -static)"
    rm -rf "$INIT_DIR" && mkdir -p "$INIT_DIR"
    if ! gcc -static -O2 -Wall -o "$INIT_DIR/init" tests/vm/init.c 2>"$INIT_DIR/gcc.log"; then
        skip all "gcc -static could not build tests/vm/init.c (libc6-dev installed?): $(tail -3 "$INIT_DIR/gcc.log" | tr '\n' ' ')"
        finish
    fi
    python3 tests/vm/mkinitramfs.py init "$INIT_DIR/init" "$INIT_DIR/init.cpio" || {
        skip all "tests/vm/mkinitramfs.py init failed"
        finish
    }
    echo "$STAMP" >"$INIT_DIR/stamp"
fi

# --- apt, on a suite of this machine's Debian mirror --------------------------------------
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
mirror() { # the Debian mirror of this machine's apt sources, into MIRROR
    [ -n "${MIRROR:-}" ] || MIRROR=${MEMSHIM_DEBIAN_MIRROR:-$(apt-cache policy 2>/dev/null | awk '
        $3 ~ /^[a-z-]+\/main$/ && $4 == "amd64" && $2 ~ /^https?:\/\/.*\/debian\/?$/ { print $2; exit }')}
    [ -n "$MIRROR" ]
}

apt_opts() { # apt_opts SUITE: the options of apt-get / apt-cache for SUITE alone
    local d=$CACHE/apt/$1
    APT=(-o "Dir::Etc::SourceList=$d/sources.list" -o Dir::Etc::SourceParts=/nonexistent
         -o "Dir::State::Lists=$d/lists" -o "Dir::Cache=$d/cache" -o Dir::State::status=/dev/null
         -o Debug::NoLocking=1 -o APT::Sandbox::User="$(id -un)" -o Acquire::Retries=3)
}

apt_update() { # apt_update SUITE
    local d=$CACHE/apt/$1
    mkdir -p "$d/lists/partial" "$d/cache/archives/partial" "$d/debs"
    echo "deb [signed-by=$KEYRING] $MIRROR $1 main" >"$d/sources.list"
    apt_opts "$1"
    say "apt-get update ($1)"
    apt-get "${APT[@]}" -qq update >"$d/update.log" 2>&1 && ! grep -q '^[EW]:' "$d/update.log"
}

# --- one kernel ------------------------------------------------------------------------
# fetch SUITE: the kernel of SUITE, ready in $CACHE/<version>; sets KVER,
# or says why not in WHY.
fetch() {
    local suite=$1 pkg ver
    KVER= WHY=
    if ! apt_update "$suite"; then
        WHY="apt-get update of $suite failed: $(grep -m1 -E '^[EW]:' "$CACHE/apt/$suite/update.log")"
        return 1
    fi
    pkg=$(apt-cache "${APT[@]}" depends linux-image-amd64 2>/dev/null \
        | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }')
    if [ -z "$pkg" ]; then
        WHY="$suite has no linux-image-amd64 for a versioned kernel"
        return 1
    fi
    KVER=${pkg#linux-image-}
    if [ -e "$CACHE/$KVER/ready" ]; then
        say "$suite: $KVER already here"
        return 0
    fi
    # Debian 14 on splits the image into linux-binary-* (the kernel) and
    # linux-modules-*; before, linux-image-* holds both.
    local pkgs=("$pkg")
    for p in $(apt-cache "${APT[@]}" depends "$pkg" 2>/dev/null | awk '$1 == "Depends:" { print $2 }'); do
        [[ $p == linux-binary-$KVER || $p == linux-modules-$KVER ]] && pkgs+=("$p")
    done
    ver=$(apt-cache "${APT[@]}" show "$pkg" 2>/dev/null | awk '$1 == "Version:" { print $2; exit }')
    local d=$CACHE/apt/$suite/debs tmp=$CACHE/$KVER.tmp
    say "$suite: apt-get download ${pkgs[*]} ($ver)"
    rm -f "$d"/*.deb
    if ! (cd "$d" && apt-get "${APT[@]}" -qq download "${pkgs[@]}") >"$d/../download.log" 2>&1; then
        WHY="apt-get download ${pkgs[*]} from $suite failed: $(tail -1 "$d/../download.log")"
        return 1
    fi
    say "$suite: $(du -cm "$d"/*.deb | tail -1 | cut -f1) MiB downloaded; extracting the kernel and the modules it needs"
    rm -rf "$tmp" && mkdir -p "$tmp/x"
    for f in "$d"/*.deb; do
        dpkg-deb --fsys-tarfile "$f" | tar -x -C "$tmp/x" --wildcards \
            '*/vmlinuz*' '*/config-*' '*/kernel/fs/*' '*/kernel/drivers/virtio/*' \
            '*/kernel/drivers/block/*' '*/kernel/net/9p/*' '*/kernel/lib/*' '*/kernel/crypto/*' \
            '*/kernel/arch/x86/crypto/*' 2>/dev/null
    done
    local vmlinuz tree
    vmlinuz=$(ls "$tmp/x/boot/vmlinuz-$KVER" "$tmp/x/usr/lib/modules/$KVER/vmlinuz" \
        "$tmp/x/lib/modules/$KVER/vmlinuz" 2>/dev/null | head -1)
    tree=$(ls -d "$tmp/x/usr/lib/modules/$KVER" "$tmp/x/lib/modules/$KVER" 2>/dev/null | head -1)
    if [ -z "$vmlinuz" ] || [ -z "$tree" ]; then
        WHY="${pkgs[*]} from $suite hold no vmlinuz or no modules for $KVER"
        return 1
    fi
    if ! python3 tests/vm/vmlinux.py "$vmlinuz" "$tmp/vmlinux" >"$tmp/vmlinux.log" 2>&1; then
        WHY="$KVER: $(tail -1 "$tmp/vmlinux.log")"
        return 1
    fi
    cat "$tmp/vmlinux.log"
    if ! python3 tests/vm/mkinitramfs.py modules "$tree" "$tmp/modules.cpio" "${MODULES[@]}" >"$tmp/modules.log" 2>&1; then
        WHY="$KVER: mkinitramfs: $(tail -1 "$tmp/modules.log")"
        return 1
    fi
    cat "$tmp/modules.log"
    cp "$tmp"/x/boot/config-* "$tmp/config" 2>/dev/null
    rm -rf "$tmp/x" "$d"/*.deb
    echo "$KVER" >"$tmp/kernel"
    echo "$suite" >"$tmp/suite"
    echo "$pkg $ver" >"$tmp/package"
    cat "$INIT_DIR/init.cpio" "$tmp/modules.cpio" >"$tmp/initramfs"
    echo "$STAMP" >"$tmp/stamp"
    return 0
}

# boot_check DIR: boots the kernel in DIR to run /bin/true (TCG, 1 vCPU);
# twice before it gives up, since a loaded machine can make a boot fail.
boot_check() {
    boot_once "$1" || { say "boot check: $WHY; once more"; boot_once "$1"; }
}

boot_once() {
    local k=$1 share
    share=$(mktemp -d "$k/boot-check.XXXXXX")
    printf '%s\0' arg=/bin/true env=PATH=/usr/bin:/bin cwd=/ "share=$share" >"$share/job"
    local t0 t1
    t0=$(date +%s.%N)
    timeout 300 qemu-system-x86_64 -nodefaults -no-user-config -display none -no-reboot \
        -machine pc -accel tcg -cpu max -smp 1 -m 512 \
        -kernel "$k/vmlinux" -initrd "$k/initramfs" -append "$CMDLINE" \
        -serial "file:$k/boot-check.log" -monitor none \
        -fsdev local,id=hostroot,path=/,readonly=on,security_model=none,multidevs=remap \
        -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot \
        -fsdev "local,id=share,path=$share,security_model=none" \
        -device virtio-9p-pci,fsdev=share,mount_tag=share >"$k/qemu.log" 2>&1
    local rc=$?
    t1=$(date +%s.%N)
    local status
    status=$(head -1 "$share/status" 2>/dev/null)
    rm -rf "$share"
    if [ "$status" != "exit 0" ]; then
        WHY="$(cat "$k/kernel") did not boot (qemu exit $rc, init status '${status:-none}'): $(
            { cat "$k/qemu.log"; grep -v '^\s*$' "$k/boot-check.log"; } | tail -2 | tr '\n' ' ')"
        return 1
    fi
    say "$(cat "$k/kernel") boots: /bin/true ran and the VM powered off after $(
        echo "$t1 $t0" | awk '{ printf "%.1f", $1 - $2 }') s"
    return 0
}

# role ROLE SUITE...: the kernel of the first SUITE that boots, linked as ROLE.
role() {
    local role=$1 why=()
    shift
    local have=$CACHE/$role
    if [ -e "$have/ready" ] && [ "${MEMSHIM_VM_REFRESH:-0}" != 1 ]; then
        if [ "$(cat "$have/stamp" 2>/dev/null)" != "$STAMP" ]; then
            say "$role: $(cat "$have/kernel"): new init, new initramfs"
            rm -f "$have/stamp"
            cat "$INIT_DIR/init.cpio" "$have/modules.cpio" >"$have/initramfs.tmp" \
                && mv "$have/initramfs.tmp" "$have/initramfs"
            if ! boot_check "$have"; then
                skip "$role" "$WHY"
                return
            fi
            echo "$STAMP" >"$have/stamp"
        fi
        # For tests/src/vm.rs, which takes an initramfs older than the
        # sources of the init for a stale one.
        touch "$have/initramfs"
        rm -f "$CACHE/$role.skip"
        say "$role: $(cat "$have/kernel") ($(cat "$have/package")) present"
        return
    fi
    if ! mirror; then
        skip "$role" "no Debian mirror in this machine's apt sources (set MEMSHIM_DEBIAN_MIRROR)"
        return
    fi
    for suite in "$@"; do
        if fetch "$suite"; then
            local k=$CACHE/$KVER
            [ -e "$k/ready" ] || k=$CACHE/$KVER.tmp
            if [ -e "$k/ready" ] || boot_check "$k"; then
                if [ "$k" = "$CACHE/$KVER.tmp" ]; then
                    rm -rf "$CACHE/$KVER" && mv "$k" "$CACHE/$KVER" && touch "$CACHE/$KVER/ready"
                fi
                ln -sfn "$KVER" "$CACHE/$role"
                rm -f "$CACHE/$role.skip"
                rm -rf "$CACHE/apt/$suite"
                say "$role: $KVER from $suite"
                return
            fi
        fi
        [ -n "$KVER" ] && rm -rf "$CACHE/$KVER.tmp"
        say "$suite: $WHY"
        why+=("$suite: $WHY")
    done
    skip "$role" "no kernel that boots: $(IFS=';'; echo "${why[*]}")"
}

say "cache $CACHE"
role bookworm bookworm
role newest "${NEWEST_SUITES[@]}"
finish
