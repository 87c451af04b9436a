#!/bin/bash
# `memshim-ctl profile` of a BERT (tests/fixtures/py_torch.py: bert-base from its config, loaded with
# sampling on) in every format: the command's time and peak RSS (GNU time), and each file's size.
# Needs `make build`, /usr/bin/time, and torch and transformers for PY (make test-deps installs them
# for pyenv's 3.11). bench/FINDINGS-profiling.md, "memshim-ctl on a BERT".
set -u
cd "$(dirname "$0")/.."
PY=${PY:-$HOME/.pyenv/versions/3.11.7/bin/python3.11}
CTL=${CTL:-./target/release/memshim-ctl}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT; mkfifo "$T/in"
MEMSHIM_PROFILE=on MEMSHIM_CONTROL=on LD_PRELOAD=$PWD/target/release/libmemshim.so $PY tests/fixtures/py_torch.py < "$T/in" > "$T/out" 2>&1 &
P=$!
exec 7>"$T/in"
for i in $(seq 60); do grep -q ready "$T/out" && break; sleep 1; done
$CTL profile $P --seconds 0 --keep >/dev/null 2>&1
echo load >&7
for i in $(seq 60); do grep -q "load:" "$T/out" && break; sleep 1; done
for f in table json pprof svg speedscope html; do
  /usr/bin/time -f "$f: %e s, %M KiB max RSS of memshim-ctl" $CTL profile $P --format $f -o "$T/bert.$f" > /dev/null 2>"$T/time.$f"; tail -1 "$T/time.$f"
done
ls -la "$T"/bert.*
echo "pprof uncompressed message: $(gunzip -c < "$T/bert.pprof" | wc -c) bytes"
head -14 "$T/bert.table"
grep "by library" "$T/bert.table"
echo quit >&7
wait $P
