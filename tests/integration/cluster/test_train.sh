#!/usr/bin/env bash
# The Keras example model on the diabetes set over 2 PS and 2 workers,
# every process started from TF_CONFIG: it reaches the quality the
# standalone trainer reaches (test MSE <= 3500), writes TensorBoard events,
# metrics.jsonl, report.html and checkpoints, and the last checkpoint
# exports to an .npz with the model's arrays under their Keras names. The
# trace shows the overlap: gradients are pushed while the step computes.
. "$(dirname "$0")/lib.sh"

write_diabetes_job "$WORK/job.json" ', "epochs": 500, "steps_per_closure": 20,
  "checkpoint": {"dir": "ckpt", "every_steps": 2000, "keep": 2},
  "logdir": "logs", "eval_every_steps": 2500'
cluster 2 2 evaluator
start_all
start_evaluator --job "$WORK/job.json" --steps 6000
start_chief --job "$WORK/job.json" --summary-json "$WORK/summary.json" \
  --trace "$WORK/trace.json"
wait_chief 240
ev_done() { grep -q "evaluated step 6000" "$WORK/evaluator.log"; }
check "evaluator evaluated the last checkpoint" wait_for 60 ev_done
ev_mse=$(sed -n 's/^evaluated step 6000: loss \([0-9.e+-]*\).*/\1/p' "$WORK/evaluator.log")

check "chief exits 0" test "$CHIEF_RC" = 0
check "summary written" test -f "$WORK/summary.json"
steps=$(json_get "$WORK/summary.json" steps 2>/dev/null || echo 0)
check "exact step count (500 epochs of 6 + 6 steps: $steps)" test "$steps" = 6000
mse=$(json_get "$WORK/summary.json" eval.loss 2>/dev/null || echo 1e9)
echo "test MSE: $mse"
check "test MSE <= 3500" /usr/bin/python3 -c "import sys; sys.exit(0 if float('$mse') <= 3500 else 1)"
echo "evaluator's MSE at the last checkpoint: $ev_mse"
check "the evaluator agrees with the chief's evaluation (1e-4 relative)" \
  /usr/bin/python3 -c "import sys; a, b = float('$mse'), float('${ev_mse:-nan}'); sys.exit(0 if abs(a - b) <= 1e-4 * abs(a) else 1)"
check "evaluator events in logs/eval" bash -c "ls $WORK/logs/eval/events.out.tfevents.* >/dev/null"
check "trace: workers' step phases, PS applies, the chief's checkpoints" \
  /usr/bin/python3 - "$WORK/trace.json" <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
x = [e for e in ev if e.get("ph") == "X"]
names = {(e["pid"] // 1000, e["name"].split(" ")[0]) for e in x}
need = {(1, "compute"), (1, "push"), (1, "input"), (1, "pull"),
        (2, "apply"), (0, "checkpoint"), (0, "evaluation")}
missing = need - names
print(len(x), "events; missing:", missing or "none")
assert not missing
assert all(e["dur"] >= 0 and e["ts"] > 1.6e15 for e in x)
PY
# Share of the worker's PS-traffic events whose name starts with $1 that
# began inside one of that worker's compute phases: above $2, or fail.
inside_compute() { # prefix min_share
  /usr/bin/python3 - "$WORK/trace.json" "$1" "$2" <<'PY'
import bisect, json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
prefix, least = sys.argv[2], float(sys.argv[3])
x = [e for e in ev if e.get("ph") == "X" and 1000 <= e["pid"] < 2000]
inside = total = 0
for pid in {e["pid"] for e in x}:
    comp = sorted((e["ts"], e["ts"] + e["dur"]) for e in x
                  if e["pid"] == pid and e["tid"] == 1 and e["name"] == "compute")
    starts = [c[0] for c in comp]
    for e in x:
        if e["pid"] != pid or e["tid"] != 2 or not e["name"].startswith(prefix):
            continue
        total += 1
        i = bisect.bisect_right(starts, e["ts"]) - 1
        inside += i >= 0 and e["ts"] <= comp[i][1]
print(f"{inside} of {total} '{prefix}' events began inside a compute phase")
assert total > 0 and inside > least * total
PY
}
check "trace: pushes leave during the compute that produced them" \
  inside_compute "push " 0.5
# async: every step but a closure's last pulls the first layer right
# behind its push; a closure's first pull comes before its first compute
check "trace: async pulls of the next step's dense values leave right behind their pushes, inside the compute" \
  inside_compute "pull dense/kernel" 0.7
check "TensorBoard event file" bash -c "ls $WORK/logs/events.out.tfevents.* >/dev/null"
check "metrics.jsonl has loss" grep -q '"loss"' "$WORK/logs/metrics.jsonl"
check "report.html" grep -q "<svg" "$WORK/logs/report.html"
check "checkpoints pruned to 2" test "$(ls -d "$WORK"/ckpt/ckpt-* | wc -l)" = 2
check "last checkpoint at the last step" test "$(ckpt_step "$WORK/ckpt")" = 6000
out=$("$TESSERA" ckpt inspect "$WORK/ckpt" 2>&1)
check "ckpt inspect lists the kernel" grep -q "dense/kernel" <<<"$out"
check "ckpt inspect shows the step" grep -q "step 6000" <<<"$out"
"$TESSERA" ckpt export "$WORK/ckpt" --npz "$WORK/weights.npz" >/dev/null
check "ckpt export writes the npz" test -s "$WORK/weights.npz"
if /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  check "npz arrays in Keras order and shapes" /usr/bin/python3 - "$WORK/weights.npz" <<'PY'
import sys, numpy as np
z = np.load(sys.argv[1])
want = [("dense/kernel", (10, 64)), ("dense/bias", (64,)),
        ("dense_1/kernel", (64, 1)), ("dense_1/bias", (1,))]
got = [(k, z[k].shape) for k in z.files]
print(got)
assert got == want, got
assert all(np.isfinite(z[k]).all() for k in z.files)
assert np.abs(z["dense/bias"]).sum() > 0   # trained, not the zero init
PY
else
  echo "numpy is not installed (deploy/setup.sh test installs python3-numpy)"
  FAILS=$((FAILS + 1))
fi
finish
