#!/usr/bin/env bash
# Convolutional, normalized and Functional Keras models on a real cluster:
#   1. the digits CNN with BatchNormalization (deploy/jobs/digits_cnn_bn.json)
#      in sync mode over 2 PS and 2 workers: the moving statistics are
#      variables on the parameter servers, updated from both workers' batch
#      statistics by the moving-average rule (checkpointed with optimizer
#      "moving_average" and no slots), evaluation uses them and reaches the
#      accuracy the standalone trainer reaches on as many steps; the npz
#      export has the 4-D Conv2D kernels and the BN arrays in Keras's order;
#   2. the Functional wide-and-deep diabetes model (two inputs placed by
#      feature name) in async mode reaches the Keras example's quality.
. "$(dirname "$0")/lib.sh"

cp "$SRC/tests/data/digits.csv" "$SRC/tests/data/diabetes.csv" "$WORK/"
cp "$SRC/deploy/models/digits_cnn_bn.json" \
   "$SRC/deploy/models/diabetes_functional.json" "$WORK/"
sed -e 's|../models/||; s|../../tests/data/||' \
    "$SRC/deploy/jobs/digits_cnn_bn.json" >"$WORK/digits.json"
sed -e 's|../models/||; s|../../tests/data/||' \
    "$SRC/deploy/jobs/diabetes_functional.json" >"$WORK/diabetes.json"

cluster 2 2
start_all
start_chief --job "$WORK/digits.json" --steps 1000 --set mode=sync \
  --checkpoint-dir "$WORK/ckpt" --summary-json "$WORK/digits_summary.json"
wait_chief 240
check "digits CNN+BN: chief exits 0" test "$CHIEF_RC" = 0
acc=$(json_get "$WORK/digits_summary.json" eval.accuracy 2>/dev/null || echo 0)
echo "digits CNN+BN, 1000 sync steps of 2 x 32: test accuracy $acc"
check "digits CNN+BN: test accuracy >= 0.93 (standalone on batches of 64: 0.95)" \
  /usr/bin/python3 -c "import sys; sys.exit(0 if float('$acc') >= 0.93 else 1)"
check "the model's layers in the chief's log" \
  grep -q "conv2d (Conv2D) 8x8x1 -> 8x8x16 linear" "$WORK/chief.log"
check "the moving statistics are checkpointed with the moving-average rule" \
  grep -rqa "moving_average" "$WORK/ckpt"
"$TESSERA" ckpt export "$WORK/ckpt" --npz "$WORK/digits.npz" >/dev/null
check "ckpt export writes the npz" test -s "$WORK/digits.npz"
if /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  check "npz: Keras order and shapes; moving statistics moved off their start" \
    /usr/bin/python3 - "$WORK/digits.npz" <<'PY'
import sys, numpy as np
z = np.load(sys.argv[1])
want = [("conv2d/kernel", (3, 3, 1, 16)),
        ("batch_normalization/gamma", (16,)), ("batch_normalization/beta", (16,)),
        ("batch_normalization/moving_mean", (16,)),
        ("batch_normalization/moving_variance", (16,)),
        ("conv2d_1/kernel", (3, 3, 16, 32)),
        ("batch_normalization_1/gamma", (32,)), ("batch_normalization_1/beta", (32,)),
        ("batch_normalization_1/moving_mean", (32,)),
        ("batch_normalization_1/moving_variance", (32,)),
        ("dense/kernel", (32, 10)), ("dense/bias", (10,))]
got = [(k, z[k].shape) for k in z.files]
print(got)
assert got == want, got
mm, mv = z["batch_normalization/moving_mean"], z["batch_normalization/moving_variance"]
print("moving mean", mm[:4], "moving variance", mv[:4])
assert np.abs(mm).max() > 1e-3          # started at zeros
assert np.abs(mv - 1).max() > 1e-3      # started at ones
assert (mv > 0).all() and np.isfinite(mm).all()
PY
else
  echo "numpy is not installed (deploy/setup.sh test installs python3-numpy)"
  FAILS=$((FAILS + 1))
fi

cluster 2 2  # the first chief stopped its cluster
start_all
start_chief --job "$WORK/diabetes.json" --steps 3000 \
  --summary-json "$WORK/diabetes_summary.json"
wait_chief 240
check "diabetes Functional: chief exits 0" test "$CHIEF_RC" = 0
mse=$(json_get "$WORK/diabetes_summary.json" eval.loss 2>/dev/null || echo 1e9)
echo "diabetes Functional wide-and-deep, 3000 async steps: test MSE $mse"
check "diabetes Functional: test MSE <= 3800" \
  /usr/bin/python3 -c "import sys; sys.exit(0 if float('$mse') <= 3800 else 1)"
check "the Functional graph in the chief's log" \
  grep -q "wide_and_deep (Concatenate) 32 + 10 -> 42" "$WORK/chief.log"
finish
