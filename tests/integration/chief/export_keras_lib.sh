# Sourced by test_export_keras_layers.sh and test_export_keras_seq.sh: the
# work folder, the helpers, and the export + read-back steps they share.
# Skips the test (77) without numpy and h5py in /usr/bin/python3.
BUILD=${TSR_BUILD_DIR:?TSR_BUILD_DIR not set}
SRC=${TSR_SOURCE_DIR:?TSR_SOURCE_DIR not set}
PY=/usr/bin/python3
. "$SRC/tests/keras_python.sh"   # KPY, KPY_WHY
CHECK=$SRC/tests/integration/chief/keras_export_check.py
$PY -c "import numpy, h5py" 2>/dev/null || { echo "no numpy/h5py: skipped"; exit 77; }
WORK=$(mktemp -d /tmp/tsr_export_XXXXXX)
trap 'rm -rf "$WORK"' EXIT
unset XDG_RUNTIME_DIR
export TMPDIR=$WORK TESSERA_LOG=warn
fail() { echo "FAIL: $*"; exit 1; }
eval_loss() { $PY -c "import json,sys; print(json.load(open(sys.argv[1]))['eval']['loss'])" "$1"; }
# close A B TOL: |A - B| <= TOL * |B|
close() { $PY -c "import sys; a,b,t=map(float,sys.argv[1:]); sys.exit(abs(a-b) > t*abs(b))" "$@"; }

# export_all KIND: the checkpoint $WORK/ck_KIND as w.npz (+ input_stats.json),
# m.keras, w.weights.h5 and w.h5 in $WORK/out_KIND
export_all() {
  local out=$WORK/out_$1
  mkdir -p "$out"
  "$BUILD/chief/tessera" ckpt export "$WORK/ck_$1" --npz "$out/w.npz" \
    --keras "$out/m.keras" --weights-h5 "$out/w.weights.h5" >"$WORK/exp_$1" 2>&1 &&
    "$BUILD/chief/tessera" ckpt export "$WORK/ck_$1" --weights-h5 "$out/w.h5" \
    >>"$WORK/exp_$1" 2>&1 || { cat "$WORK/exp_$1"; fail "$1: export"; }
}

# check_all KIND MODEL CSV LABEL LOSS: keras_export_check.py on
# $WORK/out_KIND against the eval loss in $WORK/sum_KIND.json; numpy always,
# Keras when $KPY has it (writing Keras's own files into out_KIND/keras/)
check_all() {
  local kind=$1 out=$WORK/out_$1 want
  want=$(eval_loss "$WORK/sum_$kind.json")
  $PY "$CHECK" numpy "$out" "$2" "$3" "$4" "$5" "$want" ||
    fail "$kind: the exported files do not reproduce Tessera's eval"
  if command -v "$KPY" >/dev/null 2>&1; then
    TF_CPP_MIN_LOG_LEVEL=3 "$KPY" "$CHECK" keras "$out" "$2" "$3" "$4" "$5" "$want" \
      >"$WORK/keras_$kind" 2>&1
    local rc=$?
    grep -v "^[IW]0000\|oneDNN\|cuda\|absl\|UserWarning\|warnings.warn\|retracing\|^Expected\|^Received" \
      "$WORK/keras_$kind" | tail -4
    [ $rc = 0 ] || [ $rc = 77 ] || fail "$kind: Keras does not load the export as Tessera wrote it"
    [ $rc != 77 ] || [ -z "$KPY_WHY" ] || echo "the Keras part is skipped: $KPY_WHY"
  else
    echo "no $KPY: the Keras part is skipped"
  fi
}

# one_step_loss JOB FILE: the standalone trainer from the weights in FILE,
# one step at a learning rate of 1e-12 (they do not move); prints the eval
# loss, or the log's tail on stderr and returns 1
one_step_loss() {
  timeout 120 "$BUILD/worker/tessera-worker" --standalone --job "$1" \
    --device cpu --steps 1 --set optimizer.learning_rate=1e-12 \
    --set "initial_weights=$2" --summary-json "$WORK/sa.json" >"$WORK/log_sa" 2>&1 ||
    { tail -5 "$WORK/log_sa" >&2; return 1; }
  eval_loss "$WORK/sa.json"
}
