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
. "$(dirname "$0")/export_keras_lib.sh"
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
  export_all $kind
  check_all $kind "$model" "$csv" label $loss
  out=$WORK/out_$kind
  want=$(eval_loss "$WORK/sum_$kind.json")

  # initial_weights from each file, Tessera's and Keras's own: one step at
  # a learning rate of 1e-12 evaluates to the exported run's loss
  n=0
  for w in "$out"/w.weights.h5 "$out"/w.h5 "$out"/w.npz "$out"/m.keras "$out"/keras/*; do
    [ -f "$w" ] || continue
    got=$(one_step_loss "$job" "$w") || fail "$kind: standalone from $(basename "$w")"
    close "$got" "$want" 1e-5 ||
      fail "$kind: from $(basename "$w") the eval loss is $got, the exported run's $want"
    n=$((n + 1))
  done
  # the standalone trainer's weights.npz: the export's names, order and shapes
  timeout 120 "$BUILD/worker/tessera-worker" --standalone --job "$job" \
    --device cpu --steps 1 --checkpoint-dir "$WORK/sa_ck_$kind" >"$WORK/log_sa" 2>&1 ||
    { tail -5 "$WORK/log_sa"; fail "$kind: standalone with --checkpoint-dir"; }
  $PY -c "import numpy as np, sys; a, b = map(np.load, sys.argv[1:]); \
sys.exit(a.files != b.files or any(a[k].shape != b[k].shape for k in a.files))" \
    "$WORK/sa_ck_$kind/weights.npz" "$out/w.npz" ||
    fail "$kind: the standalone trainer's weights.npz differs from the export in names, order or shapes"
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
