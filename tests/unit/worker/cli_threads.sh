#!/bin/sh
# tessera-worker --standalone --threads: a value that is not a whole number
# from 1 to 256 is refused (exit 2, naming the flag); N threads are used
# and said so in the start line and the summary line; a CNN with
# BatchNormalization trains to the same loss, bit for bit as printed, on 1
# and 3 threads (every op over the pool is cut by size, not by threads).
# Usage: cli_threads.sh TESSERA_WORKER SOURCE_DIR
set -u
W=$1
SRC=$2
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT
JOB=$SRC/tests/data/export_cnn_job.json
for bad in 0 -1 257 2x ""; do
  "$W" --standalone --job "$JOB" --device cpu --threads "$bad" --steps 1 \
    >"$T/out" 2>"$T/err"
  rc=$?
  [ $rc -eq 2 ] || { echo "--threads '$bad': exit $rc, want 2"; exit 1; }
  grep -q -- "--threads $bad: must be a whole number from 1 to 256" \
    "$T/err" || { echo "--threads '$bad':"; cat "$T/err"; exit 1; }
done
for n in 1 3; do
  TESSERA_LOG=info timeout 120 "$W" --standalone --job "$JOB" --device cpu --threads $n \
    --steps 20 --batch-size 256 >"$T/out$n" 2>"$T/err$n" ||
    { echo "--threads $n failed"; cat "$T/err$n"; exit 1; }
done
want="on cpu x1, 3 threads (convolutions: "
grep -q "$want" "$T/err3" || { echo "start line, want '$want':"; cat "$T/err3"; exit 1; }
grep -q "cpu x1, 3 threads, fp32$" "$T/out3" || { echo "summary line:"; cat "$T/out3"; exit 1; }
grep -q "cpu x1, 1 thread, fp32$" "$T/out1" || { echo "summary line:"; cat "$T/out1"; exit 1; }
l1=$(sed -n 's/.*train loss \([^,]*\), eval loss \([^ ]*\).*/\1 \2/p' "$T/out1")
l3=$(sed -n 's/.*train loss \([^,]*\), eval loss \([^ ]*\).*/\1 \2/p' "$T/out3")
[ -n "$l1" ] && [ "$l1" = "$l3" ] ||
  { echo "losses differ: 1 thread '$l1', 3 threads '$l3'"; exit 1; }
exit 0
