#!/usr/bin/env bash
# The text-classification job on a real cluster (2 PS, 2 workers, async):
# Embedding(mask_zero) + Bidirectional(LSTM) + Dense on the Reuters acq /
# crude articles (deploy/jobs/reuters_bilstm.json), its embedding a
# row-sparse variable and the recurrent kernels dense variables on the
# parameter servers: the chief exits 0 with an eval accuracy above the
# majority class (10 of 14 test articles are acq), the layers and their
# variables in Keras's names, order and shapes in the npz export. Then an
# LSTM option Tessera does not implement (stateful) is refused with one
# line that is the same standalone and in the cluster, exit 2.
. "$(dirname "$0")/lib.sh"

cp "$SRC/tests/data/reuters_tm.csv" "$SRC/deploy/models/reuters_bilstm.json" \
   "$WORK/"
sed -e 's|../models/||; s|../../tests/data/||' \
    "$SRC/deploy/jobs/reuters_bilstm.json" >"$WORK/text.json"

cluster 2 2
start_all
start_chief --job "$WORK/text.json" --steps 120 --checkpoint-dir \
  "$WORK/ckpt" --summary-json "$WORK/summary.json"
wait_chief 240
check "text job: chief exits 0" test "$CHIEF_RC" = 0
acc=$(json_get "$WORK/summary.json" eval.accuracy 2>/dev/null || echo 0)
echo "text job, 120 async steps of 2 x 8: test accuracy $acc"
check "text job: test accuracy above the majority class (10/14 = 0.714)" \
  /usr/bin/python3 -c "import sys; sys.exit(0 if float('$acc') > 0.72 else 1)"
check "the Bidirectional LSTM in the chief's log" \
  grep -q "bidirectional (Bidirectional)" "$WORK/chief.log"
"$TESSERA" ckpt export "$WORK/ckpt" --npz "$WORK/text.npz" >/dev/null
check "ckpt export writes the npz" test -s "$WORK/text.npz"
if /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  check "npz: Keras's names, order and shapes" \
    /usr/bin/python3 - "$WORK/text.npz" <<'PY'
import sys, numpy as np
z = np.load(sys.argv[1])
c = "bidirectional/%s_lstm/lstm_cell/"
want = [("embedding/embeddings", (1000, 16))]
for d in ("forward", "backward"):
    want += [(c % d + "kernel", (16, 64)), (c % d + "recurrent_kernel", (16, 64)),
             (c % d + "bias", (64,))]
want += [("dense/kernel", (32, 2)), ("dense/bias", (2,))]
got = [(k, z[k].shape) for k in z.files]
print(got)
assert got == want, got
PY
fi

# an option not implemented: the same line standalone and in the cluster
/usr/bin/python3 - "$WORK/reuters_bilstm.json" "$WORK/stateful.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
for l in m["config"]["layers"]:
    if l["class_name"] == "Bidirectional":
        l["config"]["layer"]["config"]["stateful"] = True
json.dump(m, open(sys.argv[2], "w"))
PY
sed -e 's|reuters_bilstm.json|stateful.json|' "$WORK/text.json" \
  >"$WORK/bad.json"
"$WK_BIN" --standalone --job "$WORK/bad.json" >"$WORK/alone.log" 2>&1
alone_rc=$?
start_chief --job "$WORK/bad.json" --steps 10
wait_chief 60
line=$(grep -o "layer 'bidirectional' (LSTM): stateful=true is not supported (supported: false)" \
  "$WORK/alone.log" | head -n 1)
check "standalone: exit 2" test "$alone_rc" = 2
check "standalone: the line names the layer, class, option and what is supported" \
  test -n "$line"
check "cluster: the chief exits 2" test "$CHIEF_RC" = 2
check "cluster: the same line" grep -qF "$line" "$WORK/chief.log"
finish
