#!/usr/bin/env bash
# Makes BUILD_DIR/keras-venv: a virtual environment with TensorFlow's CPU
# wheel, tf_keras and Keras 3 at the versions deploy/keras-requirements.txt
# pins, for the suite's Keras checks. `deploy/setup.sh test` calls it; the
# tests find the venv through meson's test environment (TSR_KERAS_VENV).
#
#   deploy/keras-venv.sh BUILD_DIR
#
# Made once and reused while the requirements file and the interpreter stay
# the same: their digest, KERAS_VENV/.tessera-stamp, is written last, once
# pip and an import of every Keras have succeeded, and the tests use a venv
# only with it, so a half-made venv is never used (the next run remakes
# it). The wheels are kept in BUILD_DIR/keras-wheels. When pip fails (no
# registry, no wheel for this machine) it exits 1 and writes the reason,
# one line, to BUILD_DIR/keras-venv.skip (pip's output in keras-venv.log);
# the Keras checks then skip (77) and quote it.
set -uo pipefail

if [ $# -ne 1 ]; then
  echo "usage: keras-venv.sh BUILD_DIR" >&2
  exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=$1
mkdir -p "$build" || exit 2
build=$(cd "$build" && pwd)
req=$here/keras-requirements.txt
venv=$build/keras-venv
log=$build/keras-venv.log
skip=$build/keras-venv.skip
# Debian's interpreter: python3 on PATH may be a private one (pyenv)
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3 || true)

say() { printf '[keras-venv] %s\n' "$*"; }
fail() { # reason
  printf '%s\n' "$1" >"$skip"
  rm -rf "$venv"
  say "$1"
  exit 1
}

[ -n "$py" ] || fail "no python3 to make the Keras venv with"
stamp=$( { cat "$req"; "$py" -c 'import sys; print(sys.version)'; } |
         sha256sum | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.tessera-stamp" 2>/dev/null)" = "$stamp" ]; then
  rm -f "$skip"
  say "reusing $venv"
  exit 0
fi

t0=$(date +%s)
rm -rf "$venv"
if ! "$py" -m venv "$venv" >"$log" 2>&1; then
  fail "python3 -m venv failed (is python3-venv installed?): see $log"
fi
# --no-deps: the requirements file is the complete list (see its header);
# binary wheels only: nothing is compiled here. A short timeout and three
# retries (pip backs off 0.25, 0.5, 1 s): a blip of the network does not
# cost the Keras checks, a machine without the registry gives up in
# seconds. The wheels stay in BUILD_DIR/keras-wheels: a changed pin
# downloads only what changed (pip's HTTP cache would depend on the
# registry's headers).
pipq() { "$venv/bin/python" -m pip --no-input --disable-pip-version-check \
           --no-cache-dir "$@" >>"$log" 2>&1; }
if ! pipq download --no-deps --only-binary=:all: --progress-bar off \
       --retries 3 --timeout 30 --find-links "$build/keras-wheels" \
       -d "$build/keras-wheels" -r "$req"; then
  net=$(grep -oE "Failed to establish a new connection: [^')]*|Temporary failure in name resolution|Name or service not known|Network is unreachable|Read timed out" \
        "$log" | head -1)
  why=$(grep -E '^ERROR' "$log" | head -1)
  [ -z "$net" ] || why="the package registry is unreachable: $net"
  fail "pip could not download the Keras packages (${why:-no message}); log: $log"
fi
t1=$(date +%s)
if ! pipq install --no-deps --no-index --find-links "$build/keras-wheels" \
       -r "$req"; then
  why=$(grep -E '^ERROR' "$log" | head -1)
  fail "pip could not install the Keras packages (${why:-no message}); log: $log"
fi
t2=$(date +%s)
if ! "$venv/bin/python" -c 'import numpy, tensorflow, tf_keras, keras' \
     >>"$log" 2>&1; then
  fail "Keras installed but does not import: see $log"
fi
printf '%s\n' "$stamp" >"$venv/.tessera-stamp"
rm -f "$skip"
say "made $venv: venv and download $((t1 - t0)) s, install $((t2 - t1)) s, import check $(($(date +%s) - t2)) s"
