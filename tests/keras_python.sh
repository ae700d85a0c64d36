# Sourced (sh or bash) by the checks against Keras itself. Sets
#   KPY      the interpreter to run them with: $TSR_KERAS_PYTHON when set;
#            else the venv `deploy/setup.sh test` makes in the build folder
#            ($TSR_KERAS_VENV, from meson's test environment), once it is
#            complete; else python3, which normally has no Keras
#   KPY_WHY  when KPY is that last python3: why there is no venv, for the
#            skip message (deploy/keras-venv.sh's reason when it failed)
KPY_WHY=
if [ -n "${TSR_KERAS_PYTHON:-}" ]; then
  KPY=$TSR_KERAS_PYTHON
elif [ -n "${TSR_KERAS_VENV:-}" ] && [ -x "$TSR_KERAS_VENV/bin/python" ] &&
     [ -f "$TSR_KERAS_VENV/.tessera-stamp" ]; then
  KPY=$TSR_KERAS_VENV/bin/python
else
  KPY=python3
  if [ -n "${TSR_KERAS_WHY:-}" ]; then
    KPY_WHY=$TSR_KERAS_WHY
  elif [ -n "${TSR_KERAS_VENV:-}" ] && [ -s "$TSR_KERAS_VENV.skip" ]; then
    KPY_WHY=$(head -1 "$TSR_KERAS_VENV.skip")
  else
    KPY_WHY="no Keras venv in ${TSR_KERAS_VENV:-the build folder} (deploy/setup.sh test makes it) and TSR_KERAS_PYTHON is not set"
  fi
fi
