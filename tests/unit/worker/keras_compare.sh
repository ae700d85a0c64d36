#!/bin/sh
# Runs keras_compare.py with an interpreter that has tf_keras:
# $TSR_KERAS_PYTHON, else python3 (the script exits 77 when it cannot
# import tf_keras, which meson counts as a skip).
PY=${TSR_KERAS_PYTHON:-python3}
command -v "$PY" >/dev/null 2>&1 || { echo "keras_compare: no $PY: skipped"; exit 77; }
exec "$PY" "$@"
