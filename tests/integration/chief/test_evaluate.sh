#!/usr/bin/env bash
# Evaluation alone against Tessera's own figures (keras_evaluate.py holds
# the same against Keras). The export test's CNN (BatchNormalization,
# LayerNormalization, Dropout) trains 100 steps standalone with
# --checkpoint-dir, and on a local cluster with checkpoints; then, with no
# training:
#   - tessera-worker --standalone --evaluate --checkpoint (its weights.npz),
#     tessera evaluate --checkpoint and --weights give the standalone run's
#     eval loss and accuracy exactly; tessera evaluate --checkpoint on the
#     cluster's checkpoint root and on its ckpt-<step> folder give the
#     chief's final eval figures;
#   - tessera predict writes [359, 10] probabilities in the eval rows'
#     order, whose cross-entropy and accuracy against those rows' labels
#     are the evaluated loss and accuracy;
#   - nothing changes: the weights file and every checkpoint file keep
#     their bytes, a second evaluation gives the same figures;
#   - bad arguments exit 2 and bad data 3, each with a line naming the flag
#     or the file; "epochs": 0 is refused for training with a pointer to
#     tessera evaluate, which evaluates that job.
# Skipped (77) without numpy in /usr/bin/python3.
set -u
BUILD=${TSR_BUILD_DIR:?TSR_BUILD_DIR not set}
SRC=${TSR_SOURCE_DIR:?TSR_SOURCE_DIR not set}
PY=/usr/bin/python3
$PY -c "import numpy" 2>/dev/null || { echo "no numpy: skipped"; exit 77; }
WORK=$(mktemp -d /tmp/tsr_evaluate_XXXXXX)
trap 'rm -rf "$WORK"' EXIT
unset XDG_RUNTIME_DIR
export TMPDIR=$WORK TESSERA_LOG=warn
TESSERA=$BUILD/chief/tessera
WORKER=$BUILD/worker/tessera-worker
JOB=$SRC/tests/data/export_cnn_job.json
fail() { echo "FAIL: $*"; exit 1; }
# same JSON A B [TOL]: the eval figures of two summaries agree (exactly by
# default, else to a relative TOL)
same() {
  $PY - "$1" "$2" "${3:-0}" <<'PY' || fail "$1 and $2 disagree"
import json, sys
a, b = (json.load(open(p))["eval"] for p in sys.argv[1:3])
tol = float(sys.argv[3])
assert sorted(a) == sorted(b) == ["accuracy", "loss"], (a, b)
for k in a:
    assert abs(a[k] - b[k]) <= tol * abs(b[k]), (k, a[k], b[k])
print(f"  loss {a['loss']:.6f} accuracy {a['accuracy']:.4f}")
PY
}
# expect STATUS PATTERN CMD...: the command exits STATUS and says PATTERN
expect() {
  local want=$1 pat=$2
  shift 2
  "$@" >"$WORK/out" 2>&1
  local rc=$?
  [ $rc = "$want" ] || { cat "$WORK/out"; fail "exit $rc, not $want: $*"; }
  grep -q -- "$pat" "$WORK/out" || { cat "$WORK/out"; fail "no \"$pat\": $*"; }
  echo "  exit $rc: $(grep -m1 -- "$pat" "$WORK/out" | sed 's/.*ERROR *//')"
}

echo "== standalone training, then its weights evaluated without it"
timeout 120 "$WORKER" --standalone --job "$JOB" --device cpu --steps 100 \
  --checkpoint-dir "$WORK/ck" --summary-json "$WORK/train.json" \
  >"$WORK/log" 2>&1 || { tail -5 "$WORK/log"; fail "standalone training"; }
sum_before=$(sha256sum "$WORK/ck/weights.npz")
timeout 60 "$WORKER" --standalone --evaluate --job "$JOB" --device cpu \
  --checkpoint "$WORK/ck" --summary-json "$WORK/w.json" >"$WORK/log" 2>&1 ||
  { cat "$WORK/log"; fail "tessera-worker --evaluate"; }
same "$WORK/w.json" "$WORK/train.json"
for how in "--checkpoint $WORK/ck" "--weights $WORK/ck/weights.npz"; do
  timeout 60 "$TESSERA" evaluate --job "$JOB" --device cpu $how \
    --summary-json "$WORK/e.json" >"$WORK/log" 2>&1 ||
    { cat "$WORK/log"; fail "tessera evaluate $how"; }
  same "$WORK/e.json" "$WORK/train.json"
done
grep -q "^evaluated: loss .* on 359 examples (data.eval), accuracy" "$WORK/log" ||
  { cat "$WORK/log"; fail "no result line"; }

echo "== tessera predict: the outputs behind those figures"
timeout 60 "$TESSERA" predict --job "$JOB" --device cpu \
  --weights "$WORK/ck/weights.npz" --out "$WORK/p.npy" >"$WORK/log" 2>&1 ||
  { cat "$WORK/log"; fail "tessera predict"; }
grep -q "^predictions: 359 x 10 float32 in $WORK/p.npy" "$WORK/log" ||
  { cat "$WORK/log"; fail "no predictions line"; }
$PY - "$WORK/p.npy" "$SRC/tests/data/digits.csv" "$WORK/train.json" <<'PY' ||
import json, sys
import numpy as np
p = np.load(sys.argv[1])
d = np.loadtxt(sys.argv[2], delimiter=",", skiprows=1)
y = d[np.arange(len(d)) % 5 == 4][:, -1].astype(int)
want = json.load(open(sys.argv[3]))["eval"]
assert p.shape == (359, 10) and p.dtype == np.float32, (p.shape, p.dtype)
loss = float(np.mean(-np.log(p[np.arange(len(y)), y].astype(np.float64))))
acc = float(np.mean(p.argmax(1) == y))
assert abs(loss - want["loss"]) <= 1e-5 * want["loss"], (loss, want)
assert acc == want["accuracy"], (acc, want)
print(f"  from the npy: loss {loss:.6f} accuracy {acc:.4f}")
PY
  fail "the predictions do not give the evaluated figures"
[ "$(head -1 "$SRC/tests/data/digits.csv" | tr ',' '\n' | tail -1)" = label ] ||
  fail "digits.csv: the label is not its last column"
[ "$(sha256sum "$WORK/ck/weights.npz")" = "$sum_before" ] ||
  fail "evaluation changed weights.npz"

echo "== a cluster's checkpoint"
timeout 180 "$TESSERA" local --job "$JOB" --steps 40 \
  --checkpoint-dir "$WORK/ck2" --summary-json "$WORK/c.json" \
  >"$WORK/clog" 2>&1 || { tail -20 "$WORK/clog"; fail "cluster training"; }
files_before=$(cd "$WORK/ck2" && find . -type f -exec sha256sum {} + | sort)
step_dir=$(ls -d "$WORK"/ck2/ckpt-* | sort | tail -1)
for dir in "$WORK/ck2" "$step_dir"; do
  timeout 60 "$TESSERA" evaluate --job "$JOB" --device cpu --checkpoint "$dir" \
    --summary-json "$WORK/e2.json" >"$WORK/log" 2>&1 ||
    { cat "$WORK/log"; fail "tessera evaluate --checkpoint $dir"; }
  # the workers evaluate their shares of the rows; the sums' order differs
  same "$WORK/e2.json" "$WORK/c.json" 1e-5
done
timeout 60 "$TESSERA" evaluate --job "$JOB" --device cpu --checkpoint "$WORK/ck2" \
  --summary-json "$WORK/e3.json" >/dev/null 2>&1 || fail "second evaluation"
same "$WORK/e3.json" "$WORK/e2.json"
[ "$(cd "$WORK/ck2" && find . -type f -exec sha256sum {} + | sort)" = "$files_before" ] ||
  fail "evaluation changed the checkpoint's files"

echo "== bad arguments (2) and bad data (3)"
expect 2 "tessera evaluate: the weights to use: --checkpoint DIR or --weights" \
  "$TESSERA" evaluate --job "$JOB"
expect 2 "--weights $WORK/nope.npz: No such file" \
  "$TESSERA" evaluate --job "$JOB" --weights "$WORK/nope.npz"
expect 2 "--checkpoint $WORK: neither a committed checkpoint" \
  "$TESSERA" evaluate --job "$JOB" --checkpoint "$WORK"
expect 2 "--out $WORK/p.txt: the outputs are written as .npy" \
  "$TESSERA" predict --job "$JOB" --weights "$WORK/ck/weights.npz" --out "$WORK/p.txt"
expect 2 "--out $WORK/no/p.npy" \
  "$TESSERA" predict --job "$JOB" --weights "$WORK/ck/weights.npz" --out "$WORK/no/p.npy"
[ ! -e "$WORK/no" ] || fail "a failed predict left files"
# the CPU kernels' thread limit, refused as an argument (exit 2) as the
# standalone trainer refuses it, not after the data is read
expect 2 "tessera evaluate: --threads 257: must be a whole number from 1 to 256" \
  "$TESSERA" evaluate --job "$JOB" --weights "$WORK/ck/weights.npz" --threads 257
expect 2 "--threads 257: must be a whole number from 1 to 256" \
  "$TESSERA" predict --job "$JOB" --weights "$WORK/ck/weights.npz" --threads 257 --out "$WORK/p.npy"
expect 2 "--data test: must be eval" \
  "$TESSERA" evaluate --job "$JOB" --weights "$WORK/ck/weights.npz" --data test
expect 2 "a cluster's checkpoint (manifest and shard files); evaluate it with \`tessera evaluate" \
  "$WORKER" --standalone --evaluate --job "$JOB" --checkpoint "$WORK/ck2"
expect 2 "--weights: only with --evaluate" \
  "$WORKER" --standalone --job "$JOB" --weights "$WORK/ck/weights.npz"
expect 2 "--logdir: not with --evaluate" \
  "$WORKER" --standalone --evaluate --job "$JOB" --weights "$WORK/ck/weights.npz" \
  --logdir "$WORK/tb"
# the weights of another model: the file and the variable named
timeout 60 "$WORKER" --standalone --job "$SRC/tests/data/digits_job.json" \
  --device cpu --steps 2 --checkpoint-dir "$WORK/ckd" >/dev/null 2>&1 ||
  fail "digits training"
expect 2 "$WORK/ckd/weights.npz: .*c1/kernel" \
  "$TESSERA" evaluate --job "$JOB" --weights "$WORK/ckd/weights.npz"
# bad data: a cell that is not a number, named with its file and line
mkdir -p "$WORK/bad"
awk -F, -v OFS=, 'NR == 7 { $3 = "x" } { print }' "$SRC/tests/data/digits.csv" \
  >"$WORK/bad/digits.csv"
$PY - "$JOB" "$WORK/bad" <<'PY' || fail "bad job"
import json, os, sys
j = json.load(open(sys.argv[1]))
j["model"] = os.path.join(os.path.dirname(sys.argv[1]), j["model"])
open(os.path.join(sys.argv[2], "job.json"), "w").write(json.dumps(j))
PY
expect 3 "bad/digits.csv.*line 7" \
  "$TESSERA" evaluate --job "$WORK/bad/job.json" --weights "$WORK/ck/weights.npz"
expect 3 "bad/digits.csv.*line 7" \
  "$WORKER" --standalone --evaluate --job "$WORK/bad/job.json" \
  --weights "$WORK/ck/weights.npz"
# epochs 0: refused for training with the way to evaluate; evaluated as is
$PY - "$JOB" "$WORK/e0.json" <<'PY' || fail "epochs-0 job"
import json, os, sys
j = json.load(open(sys.argv[1]))
j["model"] = os.path.join(os.path.dirname(sys.argv[1]), j["model"])
j["data"]["train"]["paths"] = os.path.join(os.path.dirname(sys.argv[1]),
                                           j["data"]["train"]["paths"])
del j["steps"]
j["epochs"] = 0
open(sys.argv[2], "w").write(json.dumps(j))
PY
expect 2 "epochs = 0 is out of range \[1, 1073741824\]: it trains nothing; to evaluate weights without training, run \`tessera evaluate" \
  "$WORKER" --standalone --job "$WORK/e0.json"
timeout 60 "$TESSERA" evaluate --job "$WORK/e0.json" --device cpu \
  --weights "$WORK/ck/weights.npz" --summary-json "$WORK/e4.json" \
  >"$WORK/log" 2>&1 || { cat "$WORK/log"; fail "evaluate an epochs-0 job"; }
same "$WORK/e4.json" "$WORK/train.json"
echo "ok"
