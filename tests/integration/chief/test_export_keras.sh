#!/usr/bin/env bash
# Weights out: a local cluster trains the diabetes job (a Dense model on
# normalized inputs) with checkpoints; `tessera ckpt export` writes the
# npz with input_stats.json, a Keras 3 .keras archive, a .weights.h5 and
# tf_keras's legacy .h5. keras_export_check.py reads them back: numpy +
# the exported normalization reproduce the eval loss Tessera reported on
# the same rows, and every file holds the npz's arrays at Keras's paths;
# the .keras config is InputLayer, Normalization, Dense, Dense. When keras
# or tf_keras imports in the Keras interpreter (tests/keras_python.sh: the
# build folder's Keras venv), load_model and load_weights predict the
# same; else that part is skipped, saying why. The exports
# start training again (initial_weights), on a cluster and standalone;
# weights of another model and the built-in wide_deep are refused with a
# message. The CNN and Functional models: test_export_keras_layers.sh.
# Skipped (77) without numpy and h5py in /usr/bin/python3.
set -u
BUILD=${TSR_BUILD_DIR:?TSR_BUILD_DIR not set}
SRC=${TSR_SOURCE_DIR:?TSR_SOURCE_DIR not set}
PY=/usr/bin/python3
. "$SRC/tests/keras_python.sh"   # KPY, KPY_WHY
$PY -c "import numpy, h5py" 2>/dev/null || { echo "no numpy/h5py: skipped"; exit 77; }
WORK=$(mktemp -d /tmp/tsr_export_XXXXXX)
trap 'rm -rf "$WORK"' EXIT
unset XDG_RUNTIME_DIR
export TMPDIR=$WORK TESSERA_LOG=warn
timeout 180 "$BUILD/chief/tessera" local --job "$SRC/tests/data/diabetes_job.json" \
  --epochs 20 --checkpoint-dir "$WORK/ck" --summary-json "$WORK/sum.json" \
  >"$WORK/log" 2>&1 || { echo "training failed"; tail -20 "$WORK/log"; exit 1; }
mkdir -p "$WORK/out"
"$BUILD/chief/tessera" ckpt export "$WORK/ck" --npz "$WORK/out/w.npz" \
  --keras "$WORK/out/m.keras" --weights-h5 "$WORK/out/w.weights.h5" \
  >"$WORK/exp" 2>&1 && "$BUILD/chief/tessera" ckpt export "$WORK/ck" \
  --weights-h5 "$WORK/out/w.h5" >>"$WORK/exp" 2>&1 ||
  { echo "export failed"; cat "$WORK/exp"; exit 1; }
grep -q "input normalization" "$WORK/exp" || { cat "$WORK/exp"; exit 1; }
# initial_weights: training starts from the exported weights. With a
# learning rate of 1e-12 they do not move, so the eval loss is the one the
# export reproduces: from the .keras on a cluster, from the .weights.h5
# and the npz in the standalone trainer.
eval_loss() { $PY -c "import json,sys; print(json.load(open(sys.argv[1]))['eval']['loss'])" "$1"; }
want=$(eval_loss "$WORK/sum.json")
timeout 180 "$BUILD/chief/tessera" local --job "$SRC/tests/data/diabetes_job.json" \
  --epochs 1 --set optimizer.learning_rate=1e-12 \
  --set "initial_weights=$WORK/out/m.keras" --checkpoint-dir "$WORK/ck3" \
  --summary-json "$WORK/sum3.json" >"$WORK/log3" 2>&1 ||
  { echo "cluster run from .keras failed"; tail -20 "$WORK/log3"; exit 1; }
for w in w.weights.h5 w.h5 w.npz; do
  timeout 120 "$BUILD/worker/tessera-worker" --standalone \
    --job "$SRC/tests/data/diabetes_job.json" --device cpu --epochs 1 \
    --set optimizer.learning_rate=1e-12 --set "initial_weights=$WORK/out/$w" \
    --summary-json "$WORK/sum_$w.json" >"$WORK/log_$w" 2>&1 ||
    { echo "standalone from $w failed"; tail -20 "$WORK/log_$w"; exit 1; }
done
for f in sum3.json sum_w.weights.h5.json sum_w.h5.json sum_w.npz.json; do
  $PY - "$WORK/$f" "$want" <<'PY' || { echo "$f: training did not start from the weights"; exit 1; }
import json, sys
got = json.load(open(sys.argv[1]))["eval"]["loss"]
want = float(sys.argv[2])
assert abs(got - want) <= 1e-4 * want, (got, want)
PY
done
# A weights file that does not fit the model is refused, naming it
timeout 60 "$BUILD/worker/tessera-worker" --standalone \
  --job "$SRC/deploy/jobs/digits.json" --device cpu --epochs 1 \
  --set "initial_weights=$WORK/out/w.npz" >"$WORK/log5" 2>&1 &&
  { echo "mismatched weights accepted"; exit 1; }
grep -q "w.npz: .* has shape 10x64, the model's dense/kernel is 64x" "$WORK/log5" ||
  { echo "no shape message:"; tail -3 "$WORK/log5"; exit 1; }
# The built-in wide_deep has no Keras form: refused with a reason
timeout 180 "$BUILD/chief/tessera" local --job "$SRC/tests/integration/worker/ctr_job.json" \
  --steps 20 --checkpoint-dir "$WORK/ck2" >"$WORK/log2" 2>&1 ||
  { echo "ctr training failed"; tail -20 "$WORK/log2"; exit 1; }
"$BUILD/chief/tessera" ckpt export "$WORK/ck2" --keras "$WORK/out/c.keras" \
  >"$WORK/exp2" 2>&1 && { echo "wide_deep exported to .keras"; exit 1; }
grep -q "no Keras counterpart (.*): export it with --npz" "$WORK/exp2" ||
  { cat "$WORK/exp2"; exit 1; }
want=$(eval_loss "$WORK/sum.json")
CHECK=$SRC/tests/integration/chief/keras_export_check.py
JOB=$SRC/tests/data/diabetes_job.json
$PY "$CHECK" numpy "$WORK/out" "$JOB" "$SRC/tests/data/diabetes.csv" target mse \
  "$want" || { echo "the export does not reproduce Tessera's eval"; exit 1; }
$PY - "$WORK/out/m.keras" <<'PY' || exit 1
import json, sys, zipfile
cfg = json.loads(zipfile.ZipFile(sys.argv[1]).read("config.json"))
names = [l["class_name"] for l in cfg["config"]["layers"]]
assert names == ["InputLayer", "Normalization", "Dense", "Dense"], names
PY
if command -v "$KPY" >/dev/null 2>&1; then
  TF_CPP_MIN_LOG_LEVEL=3 "$KPY" "$CHECK" keras "$WORK/out" "$JOB" \
    "$SRC/tests/data/diabetes.csv" target mse "$want" >"$WORK/keras" 2>&1
  rc=$?
  grep -v "^[IW]0000\|oneDNN\|cuda\|absl\|UserWarning\|warnings.warn\|retracing" \
    "$WORK/keras" | tail -4
  [ $rc = 0 ] || [ $rc = 77 ] || { echo "Keras does not load the export"; exit 1; }
  [ $rc != 77 ] || [ -z "$KPY_WHY" ] || echo "the Keras part is skipped: $KPY_WHY"
else
  echo "no $KPY: the Keras part is skipped"
fi
