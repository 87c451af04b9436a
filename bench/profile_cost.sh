#!/bin/bash
# usage: measure.sh <build dir> ; prints cpu ticks and VmHWM of the target around one `profile --seconds 0`
B=$1; export MEMSHIM_SOCKET_DIR=/tmp/wt45a-sock READY=/tmp/memshim-bench-ready.$$
rm -f $READY
LD_PRELOAD=$B/target/release/libmemshim.so MEMSHIM_PROFILE=start python3.11 $(dirname "$0")/profile_bert_target.py & P=$!
while [ ! -f $READY ]; do sleep 0.2; done; sleep 1
cpu() { awk '{print $14+$15}' /proc/$P/stat; }
hwm() { awk '/VmHWM/{print $2}' /proc/$P/status; }
c0=$(cpu); h0=$(hwm); rss0=$(awk '/VmRSS/{print $2}' /proc/$P/status)
/usr/bin/time -f "ctl wall %e s, ctl maxrss %M KiB" $B/target/release/memshim-ctl profile $P --seconds 0 --keep --top 1 >/dev/null
c1=$(cpu); h1=$(hwm)
echo "target: cpu during profile $((c1-c0)) ticks ($(getconf CLK_TCK)/s); VmRSS before ${rss0} KiB; VmHWM before ${h0} KiB after ${h1} KiB (+$((h1-h0)) KiB)"
kill $P
