#!/usr/bin/env bash
# Hybrid training (dense "allreduce") through the chief, every process
# started from TF_CONFIG: the diabetes model on a ring of 2 workers and no
# parameter server at all (the chief says so), to the quality the
# standalone trainer reaches (test MSE <= 3500) with the exact step count;
# the trace shows each gradient bucket's all-reduce beside the compute and
# TensorBoard the ring's figures; one worker's checkpointed dense values
# (the chief writes them from a worker) export equal to the standalone
# trainer's weights, on diabetes and on 100 steps of Fashion-MNIST when it
# is installed; a chief killed mid-run resumes from its checkpoint and the
# workers take the dense state back; a worker killed mid-run leaves the
# ring, which re-forms, and joins again with the others' dense state;
# both workers lost while a checkpoint's folder is made leave it no dense
# state: it fails once (not taken again at once, for ever), and the
# workers started again finish the run; `tessera partition` says where each
# variable lives; a job with sparse tables and no PS is refused naming
# cluster.ps.
. "$(dirname "$0")/lib.sh"

write_diabetes_job "$WORK/job.json" ', "epochs": 1000, "steps_per_closure": 50,
  "dense": "allreduce", "logdir": "logs"'
cluster 0 2
start_all
start_chief --job "$WORK/job.json" --summary-json "$WORK/summary.json" \
  --trace "$WORK/trace.json"
wait_chief 120
check "chief exits 0" test "$CHIEF_RC" = 0
check "the chief says no PS is needed" \
  grep -q 'no sparse table: every variable lives on the workers, no PS is needed' "$WORK/chief.log"
steps=$(json_get "$WORK/summary.json" steps 2>/dev/null || echo 0)
check "exact step count (1000 epochs of 6 global steps: $steps)" test "$steps" = 6000
mse=$(json_get "$WORK/summary.json" eval.loss 2>/dev/null || echo 1e9)
echo "test MSE: $mse"
check "test MSE <= 3500" /usr/bin/python3 -c "import sys; sys.exit(0 if float('$mse') <= 3500 else 1)"
check "TensorBoard points: all-reduce wait share and bytes per step" \
  bash -c "grep -q 'worker/1/allreduce_wait_share' $WORK/logs/metrics.jsonl && grep -q 'worker/0/allreduce_bytes_per_step' $WORK/logs/metrics.jsonl"
check "each worker joined the ring" \
  bash -c "grep -q 'rank 0 of a ring of 2 workers' $WORK/worker0.log && grep -q 'rank 1 of a ring of 2 workers' $WORK/worker1.log"
check "trace: bucket all-reduces, most of them while the step computes or right after" \
  /usr/bin/python3 - "$WORK/trace.json" <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
x = [e for e in ev if e.get("ph") == "X" and 1000 <= e["pid"] < 2000]
ar = [e for e in x if e["tid"] == 2 and e["name"].startswith("all-reduce bucket")]
comp = [e for e in x if e["tid"] == 1 and e["name"] == "compute"]
print(len(ar), "bucket all-reduces,", len(comp), "compute phases")
assert len(ar) >= len(comp) > 0
assert all(e["dur"] >= 0 for e in ar)
PY

# one worker equals the standalone trainer: the checkpoint's dense values,
# exported, against the standalone run's weights
same_as_standalone() { # job.json folder label
  "$TESSERA" ckpt export "$2/ckpt" --npz "$2/hybrid.npz" >/dev/null &&
    "$WK_BIN" --standalone --job "$1" --device cpu --checkpoint-dir "$2/sa" \
      >"$2/standalone.log" 2>&1 &&
    /usr/bin/python3 - "$2/hybrid.npz" "$2/sa/weights.npz" "$3" <<'PY'
import sys, numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
assert a.files == b.files, (a.files, b.files)
worst = max(float(np.abs(a[k] - b[k]).max() / max(np.abs(b[k]).max(), 1e-30))
            for k in a.files)
print(sys.argv[3], "largest relative difference", worst)
assert worst <= 1e-5
PY
}
mkdir -p "$WORK/one"
write_diabetes_job "$WORK/one/job.json" ', "epochs": 20, "dense": "allreduce",
  "checkpoint": {"dir": "ckpt"}'
cp "$WORK/diabetes.csv" "$WORK/one/"
cluster 0 1
start_worker 0
start_chief --job "$WORK/one/job.json"
wait_chief 120
check "one worker: chief exits 0" test "$CHIEF_RC" = 0
check "one worker equals the standalone trainer (diabetes, 1e-5)" \
  same_as_standalone "$WORK/one/job.json" "$WORK/one" diabetes
if [ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  mkdir -p "$WORK/fm"
  /usr/bin/python3 - "$SRC/tests/data/fashion_mnist_job.json" "$WORK/fm/job.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j.pop("description", None)
j.pop("epochs", None)  # "steps" alone bounds the run
j.update({"dense": "allreduce", "steps": 100, "checkpoint": {"dir": "ckpt"}})
j["data"].pop("eval", None)
json.dump(j, open(sys.argv[2], "w"))
PY
  cluster 0 1
  start_worker 0
  start_chief --job "$WORK/fm/job.json"
  wait_chief 120
  check "Fashion-MNIST, one worker: chief exits 0" test "$CHIEF_RC" = 0
  check "one worker equals the standalone trainer (Fashion-MNIST, 100 steps, 1e-5)" \
    same_as_standalone "$WORK/fm/job.json" "$WORK/fm" fashion-mnist
else
  echo "Fashion-MNIST is not installed (deploy/setup.sh installs dataset-fashion-mnist): its check is skipped"
fi

# a chief killed mid-run: it resumes from its checkpoint, the workers take
# the checkpoint's dense state
mkdir -p "$WORK/rs"
cp "$WORK/diabetes.csv" "$WORK/rs/"
write_diabetes_job "$WORK/rs/job.json" ', "epochs": 2000, "dense": "allreduce",
  "steps_per_closure": 20, "checkpoint": {"dir": "ckpt", "every_steps": 500}'
cluster 0 2
start_all
start_chief --job "$WORK/rs/job.json"
two_ckpts() { [ "$(ls -d "$WORK"/rs/ckpt/ckpt-*/manifest.json 2>/dev/null | wc -l)" -ge 2 ]; }
check "a checkpoint past step 0 before the kill" wait_for 60 two_ckpts
kill -9 "$CHIEF_PID"
wait "$CHIEF_PID" 2>/dev/null
unset 'PIDS[chief]'
start_chief --job "$WORK/rs/job.json" --summary-json "$WORK/rs/summary.json"
wait_chief 120
check "the restarted chief exits 0" test "$CHIEF_RC" = 0
check "it resumed from a checkpoint" grep -q 'resuming from the checkpoint of step' "$WORK/chief.log"
check "both workers took the checkpoint's dense state" \
  bash -c "grep -q 'dense state taken' $WORK/worker0.log && grep -q 'dense state taken' $WORK/worker1.log"
steps=$(json_get "$WORK/rs/summary.json" steps 2>/dev/null || echo 0)
check "exact step count after the restart ($steps)" test "$steps" = 12000

# a worker killed mid-run and started again: the ring re-forms without it
# at once, then with it, and it takes the others' dense state (nothing is
# rewound); the step count stays exact
mkdir -p "$WORK/wk"
cp "$WORK/diabetes.csv" "$WORK/wk/"
write_diabetes_job "$WORK/wk/job.json" ', "epochs": 2000, "dense": "allreduce",
  "steps_per_closure": 20, "checkpoint": {"dir": "ckpt", "every_steps": 500}'
cluster 0 2
start_all
start_chief --job "$WORK/wk/job.json" --summary-json "$WORK/wk/summary.json"
two_wk_ckpts() { [ "$(ls -d "$WORK"/wk/ckpt/ckpt-*/manifest.json 2>/dev/null | wc -l)" -ge 2 ]; }
check "training under way before the kill" wait_for 60 two_wk_ckpts
seen=$(wc -l <"$WORK/worker1.log")
kill -9 "${PIDS[worker1]}"
wait "${PIDS[worker1]}" 2>/dev/null
start_worker 1
wait_chief 120
check "the chief exits 0" test "$CHIEF_RC" = 0
steps=$(json_get "$WORK/wk/summary.json" steps 2>/dev/null || echo 0)
check "exact step count after the worker came back ($steps)" test "$steps" = 12000
check "the ring re-formed with the survivor, then with the worker back" \
  bash -c "grep -q 'the ring re-forms with 1 worker' $WORK/chief.log && grep -q 'the ring re-forms with 2 worker' $WORK/chief.log"
check "the returning worker took the survivor's dense state" \
  bash -c "tail -n +$((seen + 1)) $WORK/worker1.log | grep -q 'dense state from rank 0'"

# both workers lost while the chief makes a checkpoint's folder (its test
# hook holds it): the checkpoint has no worker to give its dense state and
# fails, once; it is not taken again at once (it would fail at once, for
# ever, and the workers started again would never be configured); they
# are, and the run ends with the exact step count
mkdir -p "$WORK/nw"
cp "$WORK/diabetes.csv" "$WORK/nw/"
write_diabetes_job "$WORK/nw/job.json" ', "epochs": 2000, "dense": "allreduce",
  "steps_per_closure": 20, "checkpoint": {"dir": "ckpt", "every_steps": 500}'
FGATE="$WORK/nw/folder_gate"
cluster 0 2
start_all
TESSERA_TEST_FOLDER_GATE="$FGATE" start_chief --job "$WORK/nw/job.json" \
  --summary-json "$WORK/nw/summary.json"
check "the checkpoint of step 0 is committed" \
  wait_for 60 test -f "$WORK/nw/ckpt/ckpt-000000000000/manifest.json"
touch "$FGATE"
check "the chief holds the next checkpoint's folder" \
  wait_for 60 test -f "$FGATE.held"
kill -9 "${PIDS[worker0]}" "${PIDS[worker1]}"
wait "${PIDS[worker0]}" "${PIDS[worker1]}" 2>/dev/null
both_lost() { grep -q 'lost worker:0' "$WORK/chief.log" && grep -q 'lost worker:1' "$WORK/chief.log"; }
check "the chief saw both workers go" wait_for 60 both_lost
rm -f "$FGATE"
no_dense() { grep -q 'checkpoint of step [0-9]* failed: dense state: .*no worker is ready' "$WORK/chief.log"; }
check "the checkpoint fails: no worker to give the dense state" wait_for 60 no_dense
start_worker 0
start_worker 1
wait_chief 120
check "the chief exits 0" test "$CHIEF_RC" = 0
steps=$(json_get "$WORK/nw/summary.json" steps 2>/dev/null || echo 0)
check "exact step count with the workers back ($steps)" test "$steps" = 12000
failed=$(grep -c 'checkpoint of step [0-9]* failed' "$WORK/chief.log")
check "that checkpoint failed once, and no other ($failed)" test "$failed" = 1

# where each variable lives
cat >"$WORK/ctr.json" <<'JSON'
{"model": {"builtin": "wide_deep", "dense_features": 2, "sparse_features": 1,
           "vocab": 1000, "embedding_dim": 8, "hidden": [16]},
 "loss": "binary_crossentropy", "dense": "allreduce",
 "data": {"train": {"format": "synthetic_ctr", "n": 256, "sparse": 1,
                    "dense": 2, "vocab": 1000, "ids_per_feature": 1}}}
JSON
"$TESSERA" partition --job "$WORK/ctr.json" --ps 2 --workers 3 >"$WORK/partition.log" 2>&1
check "partition: dense variables on the workers, tables on the PS" \
  bash -c "grep -q 'all-reduce' $WORK/partition.log && grep -q 'embedding_c0/embeddings' $WORK/partition.log && grep -q 'on each of 3 workers' $WORK/partition.log"

# sparse tables need a PS
cluster 0 1
start_chief --job "$WORK/ctr.json" --steps 10
wait_chief 60
check "a job with sparse tables and no PS is refused at start (exit 2)" test "$CHIEF_RC" = 2
check "the refusal names cluster.ps and the table" \
  grep -q 'cluster.ps: the model.s 2 sparse table(s) (embedding_c0/embeddings' "$WORK/chief.log"
finish
