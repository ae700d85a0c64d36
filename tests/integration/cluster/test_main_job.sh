#!/usr/bin/env bash
# The README's main job, as deploy/run-main.sh runs it: `tessera local` with
# 2 PS and 2 workers trains the Fashion-MNIST MLP to a test accuracy of at
# least 0.87, and leaves TensorBoard events, metrics.jsonl and report.html.
. "$(dirname "$0")/lib.sh"
if [ ! -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "Fashion-MNIST is not installed (deploy/setup.sh installs dataset-fashion-mnist)"
  FAILS=1; finish; exit 1
fi
"$TESSERA" local --ps 2 --workers 2 \
  --job "$SRC/deploy/jobs/fashion_mnist.json" --logdir "$WORK/logs" \
  --summary-json "$WORK/summary.json" >"$WORK/local.log" 2>&1
rc=$?
check "tessera local exits 0" test "$rc" = 0
acc=$(json_get "$WORK/summary.json" eval.accuracy 2>/dev/null || echo 0)
echo "test accuracy: $acc"
check "test accuracy >= 0.87" /usr/bin/python3 -c "import sys; sys.exit(0 if float('$acc') >= 0.87 else 1)"
check "exact step count (8 epochs of 2 x 235 steps)" test "$(json_get "$WORK/summary.json" steps 2>/dev/null)" = 3760
check "TensorBoard events" bash -c "ls $WORK/logs/events.out.tfevents.* >/dev/null"
check "report.html" grep -q "<svg" "$WORK/logs/report.html"
check "the summary names the logs" grep -q "tensorboard --logdir $WORK/logs" "$WORK/local.log"
finish
