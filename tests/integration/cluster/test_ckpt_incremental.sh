#!/usr/bin/env bash
# Incremental checkpoints (checkpoint.full_every) on a real cluster: 2 PS
# and 1 worker, sync (so that two runs are the same number for number), a
# wide-and-deep model with row-sparse embeddings, a checkpoint every 10
# steps (a closure of 5 late, as sync pauses: 0, 15, 30, 45, 60), a whole
# one every 3, 3 kept.
#   - the manifests say which are increments and what they build on, each
#     link's id the one on disk; an increment's embedding files hold only
#     the rows changed since the one before (fewer than a whole one's);
#   - pruning keeps the 3 newest and every checkpoint their chains build
#     on, nothing else, and each verifies (tessera ckpt inspect --verify
#     reads the chain);
#   - export of the last increment equals export of the same step from a
#     run whose every checkpoint is whole, and so do tessera evaluate's
#     figures (evaluation from a checkpoint reads the chain);
#   - the whole checkpoint the newest builds on damaged: verify names the
#     file; a chief started again on the folder skips the checkpoints that
#     need it (naming it) and resumes from the newest complete chain,
#     ending with the exact count.
. "$(dirname "$0")/lib.sh"

job() { # path full_every
  cat >"$1" <<JSON
{
  "model": {"builtin": "wide_deep", "dense_features": 4, "sparse_features": 2,
            "vocab": 3000, "embedding_dim": 4, "hidden": [8]},
  "loss": "binary_crossentropy",
  "optimizer": {"name": "adagrad", "learning_rate": 0.05},
  "batch_size": 32, "steps": 60, "steps_per_closure": 5, "mode": "sync",
  "seed": 3,
  "checkpoint": {"dir": "ck$2", "every_steps": 10, "keep": 3,
                 "full_every": $2},
  "data": {"train": {"format": "synthetic_ctr", "n": 4000, "dense": 4,
                     "sparse": 2, "vocab": 3000, "zipf": 0.5,
                     "ids_per_feature": 2, "data_seed": 5}}
}
JSON
}

run() { # full_every
  job "$WORK/job$1.json" "$1"
  cluster 2 1
  start_all
  start_chief --job "$WORK/job$1.json" --summary-json "$WORK/s$1.json"
  wait_chief 240
  check "full_every $1: the run ends (exit 0)" test "$CHIEF_RC" = 0
  for k in "${!PIDS[@]}"; do kill -9 "${PIDS[$k]}" 2>/dev/null; done
  wait 2>/dev/null
  PIDS=()
}

run 3
run 1
# what the folder holds, and what a restart should take when the whole
# checkpoint the newest builds on is gone
/usr/bin/python3 - "$WORK/ck3" "$WORK/plan" <<'PY'
import json, os, sys
root, plan = sys.argv[1:]
ms = {}
for d in sorted(os.listdir(root)):
    if d.startswith("ckpt-") and os.path.exists(f"{root}/{d}/manifest.json"):
        ms[int(d[5:])] = json.load(open(f"{root}/{d}/manifest.json"))
print({s: (m.get("kind"), m.get("base_step"), m.get("links")) for s, m in ms.items()})
def chain(s):
    out = [s]
    while ms[out[-1]].get("kind") == "increment":
        p = ms[out[-1]]["previous"]
        assert p["step"] in ms, f"{s}: link {p['step']} gone"
        assert ms[p["step"]]["checkpoint_id"] == p["checkpoint_id"], s
        out.append(p["step"])
    return out[::-1]
steps = sorted(ms)
newest = steps[-1]
assert ms[newest]["kind"] == "increment", ms[newest]
kept = set()
for s in steps[-3:]:
    c = chain(s)
    assert c[0] == ms[s]["base_step"] and len(c) == ms[s]["links"], (s, c)
    assert len(c) <= 3
    kept |= set(c)
assert set(steps) == kept, (steps, kept)
assert any(m.get("links") == 3 for m in ms.values()), "no chain of 3"
def emb_bytes(s):
    return sum(f["bytes"] for f in ms[s]["files"] if f["name"].startswith("embedding"))
base = ms[newest]["base_step"]
assert emb_bytes(newest) < emb_bytes(base), "an increment is not smaller"
# without that base: the newest checkpoint whose chain does not need it
fall = max(s for s in steps if base not in chain(s))
open(plan, "w").write(f"{newest} {base} {fall}\n")
print("newest", newest, "base", base, "fallback", fall)
PY
check "the chains are kept, nothing else, increments hold fewer rows" test $? = 0
read -r NEWEST BASE FALL <"$WORK/plan"
for d in "$WORK"/ck3/ckpt-*; do
  check "$(basename "$d") verifies (with what it builds on)" \
    "$TESSERA" ckpt inspect --verify "$d"
done
"$TESSERA" ckpt export "$WORK/ck3" --npz "$WORK/inc.npz" >/dev/null 2>&1
check "export of the increment" test $? = 0
"$TESSERA" ckpt export "$WORK/ck1/ckpt-$(printf %012d "$NEWEST")" \
  --npz "$WORK/whole.npz" >/dev/null 2>&1
/usr/bin/python3 - "$WORK/inc.npz" "$WORK/whole.npz" <<'PY'
import sys, numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
assert a.files == b.files, (a.files, b.files)
for k in a.files:
    assert np.array_equal(a[k], b[k]), k
print(len(a.files), "arrays equal")
PY
check "it equals the whole checkpoint of the same step" test $? = 0
# evaluation from a checkpoint (the evaluator, tessera evaluate) reads the
# increment over its chain too
for k in 3 1; do
  d="$WORK/ck$k"
  [ "$k" = 1 ] && d="$WORK/ck1/ckpt-$(printf %012d "$NEWEST")"
  "$TESSERA" evaluate --job "$WORK/job$k.json" --checkpoint "$d" \
    --data train --summary-json "$WORK/e$k.json" >"$WORK/e$k.log" 2>&1
  check "tessera evaluate of ck$k at step $NEWEST (exit 0)" test $? = 0
done
/usr/bin/python3 - "$WORK/e3.json" "$WORK/e1.json" <<'PY'
import json, sys
a, b = (json.load(open(p))["eval"] for p in sys.argv[1:3])
assert a == b and "loss" in a, (a, b)
print("evaluated", a)
PY
check "evaluating the increment gives the whole checkpoint's figures" \
  test $? = 0

# the whole checkpoint the newest builds on loses a file
victim=$(ls "$WORK/ck3/ckpt-$(printf %012d "$BASE")/"embedding*part-0-of-*.tshard | head -n 1)
rm -f "$victim"
"$TESSERA" ckpt inspect --verify "$WORK/ck3/ckpt-$(printf %012d "$NEWEST")" \
  >"$WORK/v.log" 2>&1
check "inspect --verify fails" test $? = 1
check "and names the missing file" grep -q "$(basename "$victim")" "$WORK/v.log"
cluster 2 1
start_all
start_chief --job "$WORK/job3.json" --summary-json "$WORK/s3b.json"
wait_chief 240
check "resumed: the run ends (exit 0)" test "$CHIEF_RC" = 0
check "the log names the file" grep -q "skipped.*$(basename "$victim")" \
  "$WORK/chief.log"
check "and skips the newest, which builds on it" grep -q \
  "checkpoint of step $NEWEST skipped: it builds on the checkpoint of step $BASE" \
  "$WORK/chief.log"
check "it resumes from the newest complete chain (step $FALL)" \
  grep -q "resuming from the checkpoint of step $FALL\b" "$WORK/chief.log"
check "exact step count" test "$(json_get "$WORK/s3b.json" steps)" = 60
finish
