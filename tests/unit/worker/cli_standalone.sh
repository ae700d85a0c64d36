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
# Corrupt TFRecord records skipped under skip_corrupt are counted in the
# summary line, the summary JSON and TensorBoard's input/skipped_records.
if [ -x /usr/bin/python3 ]; then
  /usr/bin/python3 - "$T/c.tfrecord" <<'PY' || exit 1
import struct, sys
def crc32c(b):
    c = 0xffffffff
    for x in b:
        c ^= x
        for _ in range(8):
            c = (c >> 1) ^ (0x82f63b78 & -(c & 1))
    return c ^ 0xffffffff
def mask(c):
    return (((c >> 15) | (c << 17)) + 0xa282ead8) & 0xffffffff
def ld(field, b):
    n, v = len(b), b""
    while True:
        v += bytes([(n & 0x7f) | (0x80 if n > 0x7f else 0)])
        n >>= 7
        if not n: break
    return bytes([field << 3 | 2]) + v + b
def feat(name, val):
    fl = ld(1, struct.pack("<f", val))          # FloatList.value, packed
    return ld(1, ld(1, name.encode()) + ld(2, ld(2, fl)))
with open(sys.argv[1], "wb") as f:
    for i in range(40):
        ex = ld(1, feat("x", i / 40.0) + feat("y", 2.0 * i / 40.0))
        data = bytearray(ex)
        if i == 7: data[3] ^= 0xff                 # a bad data CRC
        hdr = struct.pack("<Q", len(ex))
        f.write(hdr + struct.pack("<I", mask(crc32c(hdr))) + bytes(data) +
                struct.pack("<I", mask(crc32c(ex))))
PY
  cat >"$T/c.json" <<EOF2
{"model": {"class_name": "Sequential", "config": {"layers": [
   {"class_name": "InputLayer", "config": {"batch_shape": [null, 1]}},
   {"class_name": "Dense", "config": {"units": 1}}]}},
 "loss": "mse", "batch_size": 8, "epochs": 2,
 "data": {"train": {"format": "tfrecord", "paths": "c.tfrecord",
                    "label": "y", "features": ["x"], "skip_corrupt": true}}}
EOF2
  timeout 60 "$W" --standalone --job "$T/c.json" --device cpu \
    --summary-json "$T/c_sum.json" --logdir "$T/c_logs" >"$T/out" 2>"$T/err" ||
    { echo "skip_corrupt standalone failed"; cat "$T/err"; exit 1; }
  grep -q ", 2 corrupt records skipped" "$T/out" ||
    { echo "no skip count:"; cat "$T/out"; exit 1; }
  grep -q '"skipped_records": 2' "$T/c_sum.json" ||
    { echo "summary:"; cat "$T/c_sum.json"; exit 1; }
  grep -q '"tag": "input/skipped_records"' "$T/c_logs/metrics.jsonl" ||
    { echo "no input/skipped_records scalar"; exit 1; }
fi
# A metric's name is kept whole everywhere it is written (the longest one
# Keras has was cut to 31 characters): the summary line and JSON,
# metrics.jsonl, the validation run's TensorBoard tag.
M=sparse_top_k_categorical_accuracy
timeout 120 "$W" --standalone --job "$SRC/tests/data/digits_job.json" \
  --device cpu --epochs 1 --set "metrics=[\"accuracy\", \"$M\"]" \
  --logdir "$T/m_logs" --summary-json "$T/m_sum.json" >"$T/out" 2>"$T/err" ||
  { echo "digits standalone failed"; cat "$T/err"; exit 1; }
grep -q ", $M 0\.[0-9]" "$T/out" || { echo "summary line:"; cat "$T/out"; exit 1; }
grep -q "\"$M\": " "$T/m_sum.json" || { echo "summary:"; cat "$T/m_sum.json"; exit 1; }
grep -q "\"tag\": \"eval/$M\"" "$T/m_logs/metrics.jsonl" ||
  { echo "no eval/$M in metrics.jsonl"; exit 1; }
grep -aq "epoch_$M" "$T"/m_logs/validation/events.out.tfevents.* ||
  { echo "no epoch_$M in the validation run"; exit 1; }
# The synthetic CTR data knows its best AUC: the summary line shows it.
timeout 120 "$W" --standalone --job "$SRC/deploy/jobs/ctr_wide_deep.json" \
  --device cpu --steps 3 --set 'data.train.n=2000' \
  --set 'data.eval.n=500' >"$T/out" 2>"$T/err" ||
  { echo "ctr standalone failed"; cat "$T/err"; exit 1; }
grep -q "best reachable auc 0\.[0-9]" "$T/out" ||
  { echo "no best auc:"; cat "$T/out"; exit 1; }
exit 0
