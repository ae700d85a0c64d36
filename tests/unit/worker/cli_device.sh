#!/bin/sh
# tessera-worker --standalone and the device flag on a machine without a
# GPU: --device gpu fails with a clear message (exit 4), --device auto says
# once that it uses the CPU and trains. Skipped (77) where a GPU is present.
# Usage: cli_device.sh TESSERA_WORKER SOURCE_DIR
set -u
W=$1
SRC=$2
if ls /dev/nvidia[0-9]* >/dev/null 2>&1; then exit 77; fi
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT
JOB=$SRC/deploy/jobs/diabetes.json
TESSERA_LOG=info timeout 60 "$W" --standalone --job "$JOB" --device gpu \
  >"$T/out" 2>"$T/err"
rc=$?
[ $rc -eq 4 ] || { echo "--device gpu: exit $rc, want 4"; cat "$T/err"; exit 1; }
grep -q "no usable GPU" "$T/err" || { echo "no clear message:"; cat "$T/err"; exit 1; }
TESSERA_LOG=info timeout 60 "$W" --standalone --job "$JOB" --device auto \
  --epochs 2 >"$T/out" 2>"$T/err" || { echo "--device auto failed"; cat "$T/err"; exit 1; }
n=$(grep -c "using the CPU" "$T/err")
[ "$n" -eq 1 ] || { echo "'using the CPU' logged $n times"; cat "$T/err"; exit 1; }
grep -q "^final: steps 24 " "$T/out" || { echo "no summary:"; cat "$T/out"; exit 1; }
"$W" --standalone --job "$JOB" --device tpu >/dev/null 2>"$T/err"
[ $? -eq 2 ] && grep -q "must be auto, cpu or gpu" "$T/err" ||
  { echo "--device tpu not refused"; exit 1; }
exit 0
