#!/bin/sh
# tessera-worker --standalone with the chief's monitoring flags: --logdir
# gets Keras's train and validation runs, metrics.jsonl and report.html,
# --summary-json the summary, --checkpoint-dir weights.npz (read back with
# numpy when /usr/bin/python3 has it), --trace a Chrome trace with every
# step; the synthetic CTR data's best AUC is shown.
# Usage: cli_standalone.sh TESSERA_WORKER SOURCE_DIR
set -u
W=$1
SRC=$2
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT
JOB=$SRC/tests/data/diabetes_job.json
timeout 120 "$W" --standalone --job "$JOB" --device cpu --epochs 3 \
  --logdir "$T/logs" --summary-json "$T/sum.json" --checkpoint-dir "$T/ck" \
  --trace "$T/trace.json" >"$T/out" 2>"$T/err" ||
  { echo "standalone failed"; cat "$T/err"; exit 1; }
for d in "$T/logs" "$T/logs/train" "$T/logs/validation"; do
  ls "$d"/events.out.tfevents.* >/dev/null 2>&1 ||
    { echo "no event file in $d"; exit 1; }
done
[ -s "$T/logs/report.html" ] || { echo "no report.html"; exit 1; }
n=$(grep -c '"tag": "loss"' "$T/logs/metrics.jsonl")
[ "$n" -ge 30 ] || { echo "$n loss points in metrics.jsonl"; exit 1; }
grep -q '"tag": "eval/loss"' "$T/logs/metrics.jsonl" ||
  { echo "no eval/loss"; exit 1; }
grep -q '"steps": 36,' "$T/sum.json" || { echo "summary:"; cat "$T/sum.json"; exit 1; }
grep -q '"loss": ' "$T/sum.json" || { echo "no eval in the summary"; exit 1; }
[ -s "$T/ck/weights.npz" ] || { echo "no weights.npz"; exit 1; }
n=$(grep -o '"name": *"step"' "$T/trace.json" | wc -l)
[ "$n" -eq 36 ] || { echo "$n step events in the trace, want 36"; exit 1; }
if /usr/bin/python3 -c "import numpy" 2>/dev/null; then
  /usr/bin/python3 - "$T/ck/weights.npz" <<'PY' || exit 1
import sys, numpy as np
z = np.load(sys.argv[1])
assert z.files == ["dense/kernel", "dense/bias", "dense_1/kernel",
                   "dense_1/bias"], z.files
assert z["dense/kernel"].shape == (10, 64)
PY
fi
# The synthetic CTR data knows its best AUC: the summary line shows it.
timeout 120 "$W" --standalone --job "$SRC/deploy/jobs/ctr_wide_deep.json" \
  --device cpu --steps 3 --set 'data.train.n=2000' \
  --set 'data.eval.n=500' >"$T/out" 2>"$T/err" ||
  { echo "ctr standalone failed"; cat "$T/err"; exit 1; }
grep -q "best reachable auc 0\.[0-9]" "$T/out" ||
  { echo "no best auc:"; cat "$T/out"; exit 1; }
exit 0
