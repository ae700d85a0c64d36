#!/usr/bin/env bash
# The coordinator links no worker library: no object of the coordinator's
# library, nor of the model description it takes its variables from,
# defines or calls a wk_ symbol. The evaluator's library, which runs the
# model (for the evaluator sidecar, `tessera evaluate` and `tessera
# predict`), must show some (so an nm that lists nothing cannot pass this
# test).
#   no_worker_symbols.sh NM EVAL_LIB -- FILE...
set -u
nm_bin=$1 eval_lib=$2
shift 3
status=0
for f in "$@"; do
  syms=$("$nm_bin" -A "$f" 2>&1) || { echo "nm failed on $f: $syms"; exit 1; }
  bad=$(printf '%s\n' "$syms" | awk '$NF ~ /^wk_/')
  if [ -n "$bad" ]; then
    echo "FAIL: $f has worker symbols:"
    printf '%s\n' "$bad" | head -20
    status=1
  else
    echo "ok: $f: no wk_ symbol ($(printf '%s\n' "$syms" | wc -l) symbols)"
  fi
done
n=$("$nm_bin" -A "$eval_lib" | awk '$NF ~ /^wk_/' | wc -l)
if [ "$n" -eq 0 ]; then
  echo "FAIL: the evaluator's library $eval_lib shows no wk_ symbol: nm" \
       "does not list what this test looks for"
  status=1
else
  echo "ok: $eval_lib (the evaluator) calls the worker: $n wk_ symbols"
fi
exit $status
