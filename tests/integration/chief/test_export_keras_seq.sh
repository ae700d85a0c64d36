#!/usr/bin/env bash
# Weights out and back in for the sequence layers: Conv1D, the 1-D
# poolings, LSTM, GRU, Bidirectional, MultiHeadAttention, Attention
# (use_scale) and TimeDistributed(Dense), in two Functional models on
# digits read as 8 rows of 8 pixels: export_seq_model.json as tf_keras
# writes it (Bidirectional(LSTM), GRU, mha(query, value=...) by keyword)
# and export_seq3_model.json as Keras 3 writes it (Bidirectional(GRU)
# summed, LSTM, mha(query, value, key), value_dim 3); and the text job
# deploy/jobs/reuters_bilstm.json (Sequential: Embedding with mask_zero,
# Bidirectional(LSTM), Dense) for 200 steps.
#
# Each trains on a local cluster with checkpoints; `tessera ckpt export`
# writes the npz (+ input_stats.json), the .keras, the .weights.h5 and
# tf_keras's .h5. keras_export_check.py (numpy + h5py): a float64 forward
# pass from the npz reproduces Tessera's eval loss, the npz is in
# get_weights order with Keras's shapes (Attention's scale a scalar),
# every file holds the same arrays at Keras's paths (sub-layers below
# their layer: bidirectional/forward_layer/cell/vars/0,
# multi_head_attention/query_dense/vars/0 and tf_keras's _query_dense,
# time_distributed/layer/vars/0). With keras/tf_keras in
# $TSR_KERAS_PYTHON, load_model and load_weights predict the same and
# Keras's own files (k3.keras, k3.weights.h5, k3.npz, tfk.h5,
# tfk.weights.h5) are written.
#
# initial_weights: the standalone trainer from every one of these files,
# one step at a learning rate of 1e-12, evaluates to the exported run's
# loss; a cluster run from the .weights.h5 (tf_keras's own when Keras ran)
# too. A scale of the wrong shape and a missing sub-layer are refused,
# naming the dataset. Skipped (77) without numpy and h5py in
# /usr/bin/python3.
set -u
BUILD=${TSR_BUILD_DIR:?TSR_BUILD_DIR not set}
SRC=${TSR_SOURCE_DIR:?TSR_SOURCE_DIR not set}
PY=/usr/bin/python3
KPY=${TSR_KERAS_PYTHON:-python3}
CHECK=$SRC/tests/integration/chief/keras_export_check.py
$PY -c "import numpy, h5py" 2>/dev/null || { echo "no numpy/h5py: skipped"; exit 77; }
WORK=$(mktemp -d /tmp/tsr_export_seq_XXXXXX)
trap 'rm -rf "$WORK"' EXIT
unset XDG_RUNTIME_DIR
export TMPDIR=$WORK TESSERA_LOG=warn
fail() { echo "FAIL: $*"; exit 1; }
eval_loss() { $PY -c "import json,sys; print(json.load(open(sys.argv[1]))['eval']['loss'])" "$1"; }
# close A B TOL: |A - B| <= TOL * |B|
close() { $PY -c "import sys; a,b,t=map(float,sys.argv[1:]); sys.exit(abs(a-b) > t*abs(b))" "$@"; }
loss=sparse_categorical_crossentropy

for kind in seq seq3 reuters; do
  job=$SRC/tests/data/export_${kind}_job.json
  model=$SRC/tests/data/export_${kind}_model.json
  csv=$SRC/tests/data/digits.csv
  steps=()
  if [ $kind = reuters ]; then
    job=$SRC/deploy/jobs/reuters_bilstm.json model=$SRC/deploy/models/reuters_bilstm.json
    csv=$SRC/tests/data/reuters_tm.csv steps=(--steps 200)
  fi
  timeout 300 "$BUILD/chief/tessera" local --job "$job" "${steps[@]}" \
    --checkpoint-dir "$WORK/ck_$kind" --summary-json "$WORK/sum_$kind.json" \
    >"$WORK/log_$kind" 2>&1 || { tail -20 "$WORK/log_$kind"; fail "$kind: training"; }
  out=$WORK/out_$kind
  mkdir -p "$out"
  "$BUILD/chief/tessera" ckpt export "$WORK/ck_$kind" --npz "$out/w.npz" \
    --keras "$out/m.keras" --weights-h5 "$out/w.weights.h5" >"$WORK/exp_$kind" 2>&1 &&
    "$BUILD/chief/tessera" ckpt export "$WORK/ck_$kind" --weights-h5 "$out/w.h5" \
    >>"$WORK/exp_$kind" 2>&1 || { cat "$WORK/exp_$kind"; fail "$kind: export"; }
  want=$(eval_loss "$WORK/sum_$kind.json")
  $PY "$CHECK" numpy "$out" "$model" "$csv" label $loss "$want" ||
    fail "$kind: the exported files do not reproduce Tessera's eval"
  if command -v "$KPY" >/dev/null 2>&1; then
    TF_CPP_MIN_LOG_LEVEL=3 "$KPY" "$CHECK" keras "$out" "$model" "$csv" label \
      $loss "$want" >"$WORK/keras_$kind" 2>&1
    rc=$?
    grep -v "^[IW]0000\|oneDNN\|cuda\|absl\|UserWarning\|warnings.warn\|retracing\|^Expected\|^Received" \
      "$WORK/keras_$kind" | tail -4
    [ $rc = 0 ] || [ $rc = 77 ] || fail "$kind: Keras does not load the export as Tessera wrote it"
  else
    echo "no $KPY: the Keras part is skipped"
  fi

  # initial_weights from each file, Tessera's and Keras's own: one step at
  # a learning rate of 1e-12 evaluates to the exported run's loss
  n=0
  for w in "$out"/w.weights.h5 "$out"/w.h5 "$out"/w.npz "$out"/m.keras "$out"/keras/*; do
    [ -f "$w" ] || continue
    timeout 120 "$BUILD/worker/tessera-worker" --standalone --job "$job" \
      --device cpu --steps 1 --set optimizer.learning_rate=1e-12 \
      --set "initial_weights=$w" --summary-json "$WORK/sa.json" >"$WORK/log_sa" 2>&1 ||
      { tail -5 "$WORK/log_sa"; fail "$kind: standalone from $(basename "$w")"; }
    got=$(eval_loss "$WORK/sa.json")
    close "$got" "$want" 1e-5 ||
      fail "$kind: from $(basename "$w") the eval loss is $got, the exported run's $want"
    n=$((n + 1))
  done
  echo "$kind: initial_weights from $n files: eval loss $want, as the exported run"
done

# A cluster run starts from the .weights.h5 too (the parameter servers
# read the weights from the checkpoint folder); tf_keras's own when Keras
# wrote one: its MultiHeadAttention is under _query_dense, ...
w=$WORK/out_seq/w.weights.h5
[ -f "$WORK/out_seq/keras/tfk.weights.h5" ] && w=$WORK/out_seq/keras/tfk.weights.h5
want=$(eval_loss "$WORK/sum_seq.json")
timeout 300 "$BUILD/chief/tessera" local --job "$SRC/tests/data/export_seq_job.json" \
  --steps 1 --set optimizer.learning_rate=1e-12 --set "initial_weights=$w" \
  --checkpoint-dir "$WORK/ck_iw" --summary-json "$WORK/sum_iw.json" \
  >"$WORK/log_iw" 2>&1 || { tail -20 "$WORK/log_iw"; fail "cluster run from $(basename "$w")"; }
got=$(eval_loss "$WORK/sum_iw.json")
close "$got" "$want" 1e-5 || fail "cluster from $(basename "$w"): eval loss $got, the export's run $want"
echo "seq: cluster from $(basename "$w"): eval loss $got (export's run: $want)"

# Refusals, each naming the file and the dataset: Attention's scale of
# another shape than Keras's scalar, a MultiHeadAttention without its
# query sub-layer (under neither Keras 3's nor tf_keras's name)
$PY - "$WORK/out_seq/w.weights.h5" "$WORK" <<'EOF' || fail "cannot write the damaged files"
import shutil, sys, h5py, numpy as np
src, work = sys.argv[1:]
shutil.copy(src, f"{work}/scale.weights.h5")
with h5py.File(f"{work}/scale.weights.h5", "a") as f:
    del f["layers/attention/vars/0"]
    f["layers/attention/vars/0"] = np.ones(2, "float32")
shutil.copy(src, f"{work}/noquery.weights.h5")
with h5py.File(f"{work}/noquery.weights.h5", "a") as f:
    del f["layers/multi_head_attention/query_dense"]
    del f["layers/multi_head_attention/_query_dense"]
EOF
for bad in scale noquery; do
  timeout 60 "$BUILD/worker/tessera-worker" --standalone --job "$SRC/tests/data/export_seq_job.json" \
    --device cpu --steps 1 --set "initial_weights=$WORK/$bad.weights.h5" \
    >"$WORK/log_$bad" 2>&1 && fail "$bad.weights.h5 accepted"
done
grep -q "scale.weights.h5: layers/attention/vars/0 has shape 2, the model's att/scale is 1 (Keras: a scalar)" \
  "$WORK/log_scale" || { tail -3 "$WORK/log_scale"; fail "no message for the scale's shape"; }
grep -q "noquery.weights.h5: no dataset layers/multi_head_attention/query_dense/vars/0 (nor tf_keras's layers/multi_head_attention/_query_dense/vars/0) for mha/query/kernel" \
  "$WORK/log_noquery" || { tail -3 "$WORK/log_noquery"; fail "no message for the missing query"; }
exit 0
