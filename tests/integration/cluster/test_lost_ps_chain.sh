#!/usr/bin/env bash
# A PS lost in async mode and restored alone from an incremental
# checkpoint gets the rows of the whole checkpoint the increment builds
# on, not only the increment's: 2 PS, 1 worker, a wide-and-deep model
# whose embeddings (a million ids, each example's ids mostly new) are
# row-sparse, adagrad, a checkpoint every 1000 steps, a whole one every 3.
# The PS holding sparse parts is killed with -9 once the newest checkpoint
# is an increment over a whole one past step 0, and started again. Then,
# between the chain it restored (R: the whole one and its increments) and
# the first whole checkpoint after R (F, written by the restarted PS):
#   - every row the chain holds is in F (a row is never dropped: one left
#     out of the restore would be missing, or back at its initial value);
#   - adagrad's accumulator only grows: no row of F is below R's; a row
#     whose accumulator did not move was not touched, its value is R's;
#   - rows that only the whole checkpoint of the chain holds, untouched
#     since, are among them (what the test is about).
. "$(dirname "$0")/lib.sh"

# A checkpoint is due 1000 steps after the last one began; while one is
# written training goes on, so under load they come as far apart as the
# writes take (5,600 steps were seen). The kill comes at the first
# increment over a whole checkpoint past step 0 (the fifth checkpoint at
# the earliest), and the whole one after R needs up to FULL_EVERY - 1
# more: the run is long enough for both however far apart they come.
STEPS=30000
FULL_EVERY=3
cat >"$WORK/job.json" <<JSON
{
  "model": {"builtin": "wide_deep", "dense_features": 4, "sparse_features": 2,
            "vocab": 1000000, "embedding_dim": 4, "hidden": [8]},
  "loss": "binary_crossentropy",
  "optimizer": {"name": "adagrad", "learning_rate": 0.05},
  "batch_size": 16, "steps": $STEPS, "steps_per_closure": 10, "mode": "async",
  "seed": 3,
  "checkpoint": {"dir": "ckpt", "every_steps": 1000, "keep": 100,
                 "full_every": $FULL_EVERY},
  "data": {"train": {"format": "synthetic_ctr", "n": 200000, "dense": 4,
                     "sparse": 2, "vocab": 1000000, "zipf": 0.5,
                     "ids_per_feature": 1, "data_seed": 5}}
}
JSON

newest_dir() { ls -d "$WORK"/ckpt/ckpt-*/manifest.json 2>/dev/null | sort | tail -1; }
# the newest committed checkpoint is an increment over a whole one past
# step 0, short of full_every links (one more checkpoint slipping in
# before the kill lands is still an increment)
newest_is_increment() {
  local m
  m=$(newest_dir)
  [ -n "$m" ] || return 1
  /usr/bin/python3 - "$m" "$FULL_EVERY" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
ok = (m.get("kind") == "increment" and m.get("base_step", 0) > 0
      and m.get("links", 0) < int(sys.argv[2]))
sys.exit(0 if ok else 1)
PY
}
restored_alone() { grep -q "alone restored the checkpoint of step" "$WORK/chief.log"; }

cluster 2 1
start_all
start_chief --job "$WORK/job.json" --summary-json "$WORK/s.json"
check "a checkpoint of step 0 (the layout of the variables)" \
  wait_for 60 test -f "$WORK/ckpt/ckpt-000000000000/manifest.json"
# the PS holding the most sparse rows (the wide and deep embeddings' parts)
VICTIM=$(/usr/bin/python3 - "$WORK/ckpt/ckpt-000000000000/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
n = {}
for f in m["files"]:
    if f["name"].startswith("embedding"):
        n[f["ps"]] = n.get(f["ps"], 0) + 1
print(max(n, key=n.get) if n else 1)
PY
)
check "the newest checkpoint is an increment over a whole one" \
  wait_for 60 newest_is_increment
kill -9 "${PIDS[ps$VICTIM]}"
wait "${PIDS[ps$VICTIM]}" 2>/dev/null
sleep 1
start_ps "$VICTIM"
check "ps:$VICTIM restored alone" wait_for 60 restored_alone
R=$(sed -n 's/.*alone restored the checkpoint of step \([0-9]*\).*/\1/p' \
  "$WORK/chief.log" | head -1)
wait_chief 120
check "the chief exits 0" test "$CHIEF_RC" = 0
check "exact step count" test "$(json_get "$WORK/s.json" steps)" = $STEPS
check "one PS recovery" test "$(json_get "$WORK/s.json" restarts.ps)" = 1

/usr/bin/python3 - "$WORK/ckpt" "${R:--1}" "$VICTIM" <<'PY'
import json, os, struct, sys
import msgpack
import numpy as np

root, R, victim = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ms = {}
for d in os.listdir(root):
    if d.startswith("ckpt-") and os.path.exists(f"{root}/{d}/manifest.json"):
        ms[int(d[5:])] = json.load(open(f"{root}/{d}/manifest.json"))
assert R in ms, f"restored step {R} not among {sorted(ms)}"
assert ms[R]["kind"] == "increment", f"step {R} restored is {ms[R]['kind']}"
chain = [R]
while ms[chain[-1]]["kind"] == "increment":
    p = ms[chain[-1]]["previous"]
    assert ms[p["step"]]["checkpoint_id"] == p["checkpoint_id"], p
    chain.append(p["step"])
chain.reverse()
fulls = [s for s in sorted(ms) if s > R and ms[s]["kind"] == "full"]
assert fulls, f"no whole checkpoint after step {R}: {sorted(ms)}"
F = fulls[0]
print("restored", R, "chain", chain, "first whole after it", F)

def rows(step, ps):
    """file name -> {id: (value, accumulator)} of the sparse parts ps wrote"""
    out = {}
    for f in ms[step]["files"]:
        if f["ps"] != ps:
            continue
        b = open(f"{root}/ckpt-{step:012d}/{f['name']}", "rb").read()
        (hl,) = struct.unpack("<I", b[8:12])
        h = msgpack.unpackb(b[12:12 + hl], raw=False)
        if not h["sparse"]:
            continue
        a = {s["name"]: np.frombuffer(
                 b, s["dtype"], offset=16 + hl + s["offset"],
                 count=s["nbytes"] // np.dtype(s["dtype"]).itemsize
             ).reshape(s["shape"]) for s in h["sections"]}
        out[f["name"]] = {int(i): (a["value"][k], a["slot/accumulator"][k])
                          for k, i in enumerate(a["ids"])}
    return out

bad = []
for ps in sorted({f["ps"] for f in ms[F]["files"]}):
    held, base_only = {}, {}
    for k, s in enumerate(chain):
        for name, t in rows(s, ps).items():
            held.setdefault(name, {}).update(t)
            if k == 0:
                base_only[name] = set(t)
            else:
                base_only.setdefault(name, set()).difference_update(t)
    fin = rows(F, ps)
    n = missing = lower = moved = kept = kept_base = 0
    for name, t in held.items():
        got = fin.get(name, {})
        for i, (v, acc) in t.items():
            n += 1
            if i not in got:
                missing += 1
                continue
            fv, facc = got[i]
            if np.any(facc < acc):
                lower += 1
            elif np.array_equal(facc, acc) and not np.array_equal(fv, v):
                moved += 1
            elif np.array_equal(facc, acc):
                kept += 1
                kept_base += i in base_only.get(name, ())
    print(f"ps:{ps}: {n} rows in the chain, {missing} missing from step {F}, "
          f"{lower} with a smaller accumulator, {moved} changed untouched; "
          f"{kept} untouched ({kept_base} held by step {chain[0]} alone)")
    if missing or lower or moved:
        bad.append(f"ps:{ps} lost rows of the chain {chain}")
    if ps == victim and kept_base == 0:
        bad.append(f"ps:{ps}: no row of step {chain[0]} alone stayed untouched")
assert not bad, bad
PY
check "the restarted PS kept every row of the chain it restored" test $? = 0
finish
