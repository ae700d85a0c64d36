#!/bin/bash
# Fashion-MNIST CNN (deploy/jobs/fashion_mnist_cnn.json): Tessera's
# standalone trainer against Keras's fit, examples/s at the same threads,
# alternating runs in one process per thread count (bench_cnn_fit.py).
#
#   bench_cnn_fit.sh WORKER_EXE   (env THREADS="1 2", PAIRS=3, STEPS=100,
#                                  LOAD=N: stress-ng --cpu N meanwhile)
#
# Ends with RATIO cnn_fmnist_vs_keras_fit_<N>t lines (goal 1.0). Keras
# comes from $TSR_KERAS_PYTHON (else python3); exits 77 without it.
set -u
WORKER=$1
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
PY=${TSR_KERAS_PYTHON:-python3}
JOB=${JOB:-$ROOT/deploy/jobs/fashion_mnist_cnn.json}
"$PY" -c 'import tf_keras' 2>/dev/null || "$PY" -c 'import keras' 2>/dev/null \
  || { echo "SKIP: no Keras in $PY (set TSR_KERAS_PYTHON)"; exit 77; }
[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  { echo "SKIP: no Fashion-MNIST (Debian package dataset-fashion-mnist)"; exit 77; }
LOADPID=
if [ "${LOAD:-0}" -gt 0 ]; then
  command -v stress-ng >/dev/null || { echo "LOAD=$LOAD needs stress-ng"; exit 1; }
  stress-ng --cpu "$LOAD" --quiet &
  LOADPID=$!
  trap 'kill $LOADPID 2>/dev/null; wait $LOADPID 2>/dev/null' EXIT
  echo "under load: stress-ng --cpu $LOAD"
fi
rc=0
for t in ${THREADS:-1 2}; do
  "$PY" "$HERE/bench_cnn_fit.py" "$WORKER" "$JOB" "$t" \
    --pairs "${PAIRS:-3}" --steps "${STEPS:-100}" || rc=$?
done
exit $rc
