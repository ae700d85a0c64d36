#!/bin/sh
# Runs keras_compare.py with the interpreter that has tf_keras (see
# tests/keras_python.sh: $TSR_KERAS_PYTHON, else the build folder's Keras
# venv, else python3). The script exits 77 when it cannot import tf_keras,
# which meson counts as a skip; this then says why there is no Keras.
. "${TSR_SOURCE_DIR:?TSR_SOURCE_DIR not set}/tests/keras_python.sh"
if ! command -v "$KPY" >/dev/null 2>&1; then
  echo "keras_compare: no $KPY: skipped"
  exit 77
fi
"$KPY" "$@"
rc=$?
if [ $rc = 77 ] && [ -n "$KPY_WHY" ]; then
  echo "keras_compare: $KPY_WHY"
fi
exit $rc
