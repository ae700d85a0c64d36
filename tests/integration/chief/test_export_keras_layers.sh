#!/usr/bin/env bash
# Weights out and back in for the models beyond Dense: a CNN with
# Conv2D, BatchNormalization (moving statistics), LayerNormalization,
# pooling, Reshape, Flatten and Dropout (tests/data/export_cnn_job.json),
# and a Functional model whose inputs are placed by feature name in
# another order than the columns, with a layer listed before the layers
# Keras orders ahead of it (export_functional_job.json).
#
# Each trains on a local cluster with checkpoints; `tessera ckpt export`
# writes the npz (+ input_stats.json), the .keras archive, the
# .weights.h5 and tf_keras's legacy .h5. keras_export_check.py reads them
# with numpy + h5py: a float64 forward pass from the npz reproduces the
# eval loss Tessera reported, the npz is in get_weights order and every
# file holds the same arrays at Keras's paths. With keras or tf_keras in
# $TSR_KERAS_PYTHON (else python3), load_model and load_weights predict
# the same, and the files Keras writes itself start Tessera too;
# without them that part is skipped with a message.
#
# initial_weights: a cluster run from the CNN's .keras, one step at a
# learning rate of 1e-12, evaluates to the exported run's eval loss (the
# BatchNormalization moving statistics take that one step's batch at
# momentum 0.99, hence a tolerance of 3%); the same run with the job's
# learning rate continues training (its eval loss ends far below where it
# started); the standalone trainer from the .weights.h5, the .h5 and the
# npz (and Keras's own files) gives one and the same loss.
# Skipped (77) without numpy and h5py in /usr/bin/python3.
set -u
. "$(dirname "$0")/export_keras_lib.sh"

for kind in cnn functional; do
  job=$SRC/tests/data/export_${kind}_job.json
  if [ $kind = cnn ]; then
    csv=$SRC/tests/data/digits.csv label=label loss=sparse_categorical_crossentropy
  else
    csv=$SRC/tests/data/diabetes.csv label=target loss=mse
  fi
  timeout 300 "$BUILD/chief/tessera" local --job "$job" \
    --checkpoint-dir "$WORK/ck_$kind" --summary-json "$WORK/sum_$kind.json" \
    >"$WORK/log_$kind" 2>&1 || { tail -20 "$WORK/log_$kind"; fail "$kind: training"; }
  export_all $kind
  check_all $kind "$SRC/tests/data/export_${kind}_model.json" "$csv" $label $loss
  out=$WORK/out_$kind
  want=$(eval_loss "$WORK/sum_$kind.json")

  # initial_weights: the standalone trainer from each file of these
  # weights: one step at a learning rate of 1e-12 gives one loss, which
  # is the exported run's within the moving statistics' one step
  first=
  for w in "$out"/w.weights.h5 "$out"/w.h5 "$out"/w.npz "$out"/m.keras "$out"/keras/*; do
    [ -f "$w" ] || continue
    got=$(one_step_loss "$job" "$w") || fail "$kind: standalone from $(basename "$w")"
    [ -n "$first" ] || first=$got
    [ "$got" = "$first" ] || fail "$kind: from $(basename "$w") the loss is $got, from the first file $first"
  done
  # the standalone trainer's own weights.npz is in get_weights order too
  timeout 120 "$BUILD/worker/tessera-worker" --standalone --job "$job" \
    --device cpu --steps 1 --checkpoint-dir "$WORK/sa_ck_$kind" >"$WORK/log_sa" 2>&1 ||
    { tail -5 "$WORK/log_sa"; fail "$kind: standalone with --checkpoint-dir"; }
  $PY -c "import numpy as np, sys; a, b = (np.load(f).files for f in sys.argv[1:]); sys.exit(a != b)" \
    "$WORK/sa_ck_$kind/weights.npz" "$out/w.npz" || fail "$kind: weights.npz not in get_weights order"
  close "$first" "$want" 0.03 ||
    fail "$kind: the standalone trainer from the exported weights evaluates to $first, the export's run to $want"
  echo "$kind: initial_weights from every file: eval loss $first after one step (export's run: $want)"
done

# A cluster run from the CNN's .keras: after one step at 1e-12 the eval
# loss is the exported run's; with the job's learning rate it goes on down
job=$SRC/tests/data/export_cnn_job.json
want=$(eval_loss "$WORK/sum_cnn.json")
timeout 300 "$BUILD/chief/tessera" local --job "$job" --steps 1 \
  --set optimizer.learning_rate=1e-12 --set "initial_weights=$WORK/out_cnn/m.keras" \
  --checkpoint-dir "$WORK/ck_iw1" --summary-json "$WORK/sum_iw1.json" \
  >"$WORK/log_iw1" 2>&1 || { tail -20 "$WORK/log_iw1"; fail "cluster run from .keras"; }
step1=$(eval_loss "$WORK/sum_iw1.json")
close "$step1" "$want" 0.03 || fail "cluster from .keras: eval loss $step1 after one step, the export's run $want"
timeout 300 "$BUILD/chief/tessera" local --job "$job" \
  --set "initial_weights=$WORK/out_cnn/m.keras" \
  --checkpoint-dir "$WORK/ck_iw2" --summary-json "$WORK/sum_iw2.json" \
  >"$WORK/log_iw2" 2>&1 || { tail -20 "$WORK/log_iw2"; fail "cluster run from .keras"; }
more=$(eval_loss "$WORK/sum_iw2.json")
$PY -c "import sys; sys.exit(not float(sys.argv[1]) < 0.75 * float(sys.argv[2]))" "$more" "$want" ||
  fail "cluster from .keras: $more after the job's 300 steps more, not below the $want it started from"
echo "cnn: cluster from .keras: eval loss $step1 after one step (export's run: $want), $more after 300 steps more"

# A weights file named neither .weights.h5 nor .h5 is refused, naming both
"$BUILD/chief/tessera" ckpt export "$WORK/ck_cnn" --weights-h5 "$WORK/w.bin" \
  >"$WORK/exp_bad" 2>&1 && fail "--weights-h5 w.bin accepted"
grep -q "w.bin: name the file NAME.weights.h5 .* or NAME.h5" "$WORK/exp_bad" ||
  { cat "$WORK/exp_bad"; fail "no message for w.bin"; }
# Weights of another model are refused, naming the dataset and both shapes
timeout 60 "$BUILD/worker/tessera-worker" --standalone --job "$SRC/tests/data/export_cnn_job.json" \
  --device cpu --steps 1 --set "initial_weights=$WORK/out_functional/w.h5" \
  >"$WORK/log_bad" 2>&1 && fail "the Functional model's weights started the CNN"
grep -q "w.h5: .*the model's c1/kernel is 3x3x1x8" "$WORK/log_bad" ||
  { tail -3 "$WORK/log_bad"; fail "no message for mismatched weights"; }
exit 0
