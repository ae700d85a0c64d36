#!/bin/sh
# Runs keras_evaluate.py with the interpreter that has tf_keras (see
# tests/keras_python.sh); it exits 77 without one, and this says why.
. "${TSR_SOURCE_DIR:?TSR_SOURCE_DIR not set}/tests/keras_python.sh"
if ! command -v "$KPY" >/dev/null 2>&1; then
  echo "keras_evaluate: no $KPY: skipped"
  exit 77
fi
TF_CPP_MIN_LOG_LEVEL=3 "$KPY" "$@"
rc=$?
if [ $rc = 77 ] && [ -n "$KPY_WHY" ]; then
  echo "keras_evaluate: $KPY_WHY"
fi
exit $rc
