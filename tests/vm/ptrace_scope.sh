#!/bin/sh
# Run inside a test VM as root (tests/tests/cgroup_vm.rs,
# yama_ptrace_scope_refusals_match_the_kernel): memshim-ctl's ptrace road
# against Yama's ptrace_scope, which this machine's kernel lacks.
#
#   ptrace_scope.sh MEMSHIM_CTL
#
# Starts a CPython (Debian's /usr/bin/python3, which every uid can run)
# as uid 65534, without the preload. For each scope 0 to 3 (3 last: it
# cannot be lowered until reboot), as that same uid and as root, it asks
# the kernel itself (PTRACE_SEIZE then exit, which stops nothing) and
# memshim-ctl (`stats PID`), and prints one line per try:
#
#   try scope=S as=nobody|root kernel=ERRNO ctl=EXIT reached=N tracer=PID
#
# (reached: 1 when memshim-ctl's answer says it reached the process by
# ptrace)
#
# then "target alive=1 tracer=0" if the target still sleeps untraced, and
# memshim-ctl's last refusal on stderr.
set -u
y=/proc/sys/kernel/yama/ptrace_scope
[ -w "$y" ] || { echo "no-yama"; exit 0; }
# A copy every uid can run: the checkout may be under a private directory.
ctl=/tmp/memshim-ctl
cp "$1" "$ctl" && chmod 755 "$ctl"
nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
seize='import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
r = libc.ptrace(0x4206, int(sys.argv[1]), None, None)
print(0 if r == 0 else ctypes.get_errno())'

# setpriv execs the CPython, so $! is its pid (a function would fork a
# subshell first).
setpriv --reuid=65534 --regid=65534 --clear-groups \
    /usr/bin/python3 -c 'import time; print("ready", flush=True); time.sleep(600)' >/tmp/target.out &
target=$!
i=0
until grep -q ready /tmp/target.out 2>/dev/null; do
    i=$((i + 1)); [ $i -lt 600 ] || { echo "target never ready"; exit 1; }
    sleep 0.1
done
for s in 0 1 2 3; do
    echo "$s" >"$y"
    for who in nobody root; do
        if [ $who = nobody ]; then run=nobody; else run=; fi
        k=$($run /usr/bin/python3 -c "$seize" "$target")
        $run "$ctl" stats "$target" >/tmp/ctl.out 2>/tmp/ctl.err
        c=$?
        r=$(grep -c 'reached by ptrace' /tmp/ctl.out)
        t=$(awk '/^TracerPid/ {print $2}' /proc/$target/status)
        echo "try scope=$s as=$who kernel=$k ctl=$c reached=$r tracer=$t"
    done
done
alive=0
kill -0 "$target" 2>/dev/null && alive=1
echo "target alive=$alive tracer=$(awk '/^TracerPid/ {print $2}' /proc/$target/status)"
cat /tmp/ctl.err >&2
kill "$target"
