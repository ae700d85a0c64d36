#!/usr/bin/env bash
# Without the package registry the Keras venv is not made and the checks
# against Keras skip, saying why: deploy/keras-venv.sh with pip pointed at
# a port nothing listens on (127.0.0.1:9) exits 1, leaves no venv (so no
# later run mistakes a half-made one for a complete one) and writes pip's
# reason to BUILD_DIR/keras-venv.skip; keras_compare.sh then exits 77 and
# quotes it (whatever reason the calling suite gives its own skips, as
# deploy/setup.sh does for the ASan run). Skipped (77) without python3's venv module.
set -u
SRC=${TSR_SOURCE_DIR:?TSR_SOURCE_DIR not set}
/usr/bin/python3 -c "import venv, ensurepip" 2>/dev/null ||
  { echo "no python3-venv: skipped"; exit 77; }
WORK=$(mktemp -d /tmp/tsr_kvenv_XXXXXX)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export PIP_CONFIG_FILE=/dev/null PIP_INDEX_URL=http://127.0.0.1:9/simple \
       PIP_FIND_LINKS= PIP_NO_CACHE_DIR=1
"$SRC/deploy/keras-venv.sh" "$WORK/b" >"$WORK/out" 2>&1
rc=$?
cat "$WORK/out"
[ $rc = 1 ] || fail "keras-venv.sh exited $rc without the registry, not 1"
grep -q "the package registry is unreachable" "$WORK/b/keras-venv.skip" ||
  fail "no reason in keras-venv.skip: $(cat "$WORK/b/keras-venv.skip" 2>&1)"
[ ! -e "$WORK/b/keras-venv" ] || fail "a half-made venv was left"
env -u TSR_KERAS_PYTHON -u TSR_KERAS_WHY TSR_KERAS_VENV="$WORK/b/keras-venv" \
  sh "$SRC/tests/unit/worker/keras_compare.sh" \
  "$SRC/tests/unit/worker/keras_compare.py" /bin/false >"$WORK/kc" 2>&1
rc=$?
cat "$WORK/kc"
[ $rc = 77 ] || fail "keras_compare exited $rc, not 77 (skip)"
grep -q "^keras_compare: pip could not download the Keras packages (the package registry is unreachable" \
  "$WORK/kc" || fail "the skip does not say why"
echo "ok"
