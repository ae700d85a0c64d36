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
# a checkpoint's dense variables come from a worker that holds the
# trained state (workers killed and started again while its folder is
# made: from the survivor, or with none the newest checkpoint's), and the
# runs end with the exact step count; a sync hybrid run with a table on 2
# PS, a PS killed: the chief breaks both workers' rings as the global
# recovery starts and the run ends exact; `tessera partition` says where each
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

# A checkpoint's dense variables come from a worker that holds the ring's
# trained state, never from one configured since (a fresh process, its
# initial values). The chief's test hook holds a checkpoint's folder while
# workers are killed and started again, and lets it go once the chief has
# configured them (ready, in no ring yet): with worker 0 alone killed, the
# checkpoint is written from worker 1's state; with both, no worker holds
# the state, and the checkpoint takes the newest committed one's (what the
# next ring goes on from), equal to it. Each run ends 0 with the exact step
# count and no checkpoint failed.
same_npz() { # a.npz b.npz: 0 when every array is equal
  /usr/bin/python3 - "$1" "$2" <<'PY'
import sys, numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
sys.exit(0 if a.files == b.files and
         all(np.array_equal(a[k], b[k]) for k in a.files) else 1)
PY
}
differs() { [ -f "$1" ] && [ -f "$2" ] && ! same_npz "$1" "$2"; }
no_ckpt_failed() { # log-line offset
  ! tail -n +"$1" "$WORK/chief.log" | grep -q 'checkpoint of step [0-9]* failed'
}
from_worker() { # checkpoint folder, worker: its dense parts, by that worker only
  grep -aq "tessera-chief (worker:$2)" "$1"/* &&
    ! grep -aq "tessera-chief (worker:$((1 - $2)))" "$1"/*
}
eval_loss() { # step: the chief's evaluation of that step in this run
  tail -n +"$LOG0" "$WORK/chief.log" | sed -n "s/.*eval at step $1: loss \([^ ]*\)$/\1/p" | head -1
}
below() { /usr/bin/python3 -c "import sys; sys.exit(0 if float('$1') < float('$2') else 1)" 2>/dev/null; }
ready_again() { # log-line offset, workers...: each configured again since
  local w
  for w in "${@:2}"; do
    tail -n +"$1" "$WORK/chief.log" | grep -q "worker:$w (.*) ready on" || return 1
  done
}
held_run() { # folder, workers to kill...
  local label=$1 d="$WORK/$1" w; shift
  mkdir -p "$d"
  cp "$WORK/diabetes.csv" "$d/"
  write_diabetes_job "$d/job.json" ', "epochs": 2000, "dense": "allreduce",
  "steps_per_closure": 20, "eval_every_steps": 500,
  "checkpoint": {"dir": "ckpt", "every_steps": 500, "keep": 1000}'
  FGATE="$d/folder_gate"
  LOG0=$(($(wc -l <"$WORK/chief.log") + 1))
  cluster 0 2
  start_all
  echo 1000 >"$FGATE" # held: the first folder of a step >= 1000
  TESSERA_TEST_FOLDER_GATE="$FGATE" start_chief --job "$d/job.json" \
    --summary-json "$d/summary.json"
  check "$label: the chief holds a checkpoint's folder past step 1000" \
    wait_for 60 test -s "$FGATE.held"
  HELD=$(cat "$FGATE.held")
  for w in "$@"; do kill -9 "${PIDS[worker$w]}"; wait "${PIDS[worker$w]}" 2>/dev/null; done
  local seen=$(($(wc -l <"$WORK/chief.log") + 1))
  for w in "$@"; do start_worker "$w"; done
  check "$label: the workers started again are configured" \
    wait_for 60 ready_again "$seen" "$@"
  rm -f "$FGATE"
  wait_chief 120
  check "$label: the chief exits 0" test "$CHIEF_RC" = 0
  local steps
  steps=$(json_get "$d/summary.json" steps 2>/dev/null || echo 0)
  check "$label: exact step count ($steps)" test "$steps" = 12000
  check "$label: no checkpoint failed" no_ckpt_failed "$LOG0"
  HELD_DIR=$(printf '%s/ckpt/ckpt-%012d' "$d" "$HELD")
  "$TESSERA" ckpt export "$HELD_DIR" --npz "$d/held.npz" >/dev/null 2>&1
  "$TESSERA" ckpt export "$d/ckpt/ckpt-000000000000" --npz "$d/initial.npz" \
    >/dev/null 2>&1
}
held_run one_back 0
check "one_back: the held checkpoint ($HELD) was written from worker 1's state" \
  from_worker "$HELD_DIR" 1
check "one_back: its dense values are trained, not the initial ones" \
  differs "$WORK/one_back/held.npz" "$WORK/one_back/initial.npz"
first=$(tail -n +"$LOG0" "$WORK/chief.log" | sed -n 's/.*eval at step \([0-9]*\): loss.*/\1/p' | head -1)
l_first=$(eval_loss "${first:-x}")
l_held=$(eval_loss "$HELD")
check "one_back: the evaluation of step $HELD is not on the worker started again (its loss $l_held below step ${first:-none}'s $l_first)" \
  below "${l_held:-x}" "${l_first:-x}"
held_run both_back 0 1
from=$(tail -n +"$LOG0" "$WORK/chief.log" | sed -n "s/.*was lost: they go on from the checkpoint of step \([0-9]*\) .*/\1/p" | head -1)
check "both_back: the chief says the workers go on from the newest checkpoint's dense state (step ${from:-none})" \
  test -n "$from"
if [ -n "$from" ]; then
  "$TESSERA" ckpt export "$(printf '%s/ckpt/ckpt-%012d' "$WORK/both_back" "$from")" \
    --npz "$WORK/both_back/from.npz" >/dev/null 2>&1
fi
check "both_back: its dense values equal the checkpoint of step ${from:-none}'s, trained" \
  test "${from:-0}" -gt 0
check "both_back: its dense values equal the checkpoint of step ${from:-none}'s" \
  same_npz "$WORK/both_back/held.npz" "$WORK/both_back/from.npz"
check "both_back: and not the initial ones" \
  differs "$WORK/both_back/held.npz" "$WORK/both_back/initial.npz"
l_from=$(eval_loss "${from:-x}")
l_held=$(eval_loss "$HELD")
check "both_back: the evaluation of step $HELD, on a worker started again, sees the dense state of step ${from:-none} ($l_held, $l_from)" \
  test -n "$l_held" -a "$l_held" = "$l_from"

# a sync hybrid run with its table on 2 PS: a PS killed mid-run starts a
# global recovery, and the chief breaks every worker's ring as it starts
# (a worker whose closure failed at the lost PS leaves its peer waiting in
# an all-reduce for a part that will not come: that closure now ends at
# once, not at the ring's stall bound); the run ends with the exact count
mkdir -p "$WORK/sb"
cat >"$WORK/sb/job.json" <<'JSON'
{"model": {"builtin": "wide_deep", "dense_features": 2, "sparse_features": 1,
           "vocab": 1000, "embedding_dim": 8, "hidden": [16]},
 "loss": "binary_crossentropy", "dense": "allreduce", "mode": "sync",
 "steps": 4000, "steps_per_closure": 10, "batch_size": 32,
 "checkpoint": {"dir": "ckpt", "every_steps": 400},
 "data": {"train": {"format": "synthetic_ctr", "n": 4096, "sparse": 1,
                    "dense": 2, "vocab": 1000, "ids_per_feature": 1}}}
JSON
SB0=$(($(wc -l <"$WORK/chief.log") + 1))
W0=$(($(cat "$WORK/worker0.log" 2>/dev/null | wc -l) + 1))
W1=$(($(cat "$WORK/worker1.log" 2>/dev/null | wc -l) + 1))
cluster 2 2
start_all
start_chief --job "$WORK/sb/job.json" --summary-json "$WORK/sb/summary.json"
check "sync, tables on 2 PS: a checkpoint past step 0" \
  wait_for 60 bash -c "test \$(ls -d $WORK/sb/ckpt/ckpt-*/manifest.json 2>/dev/null | wc -l) -ge 2"
kill -9 "${PIDS[ps1]}"
wait "${PIDS[ps1]}" 2>/dev/null
start_ps 1
wait_chief 120
check "sync, tables on 2 PS: the chief exits 0" test "$CHIEF_RC" = 0
steps=$(json_get "$WORK/sb/summary.json" steps 2>/dev/null || echo 0)
check "sync, tables on 2 PS: exact step count after the PS came back ($steps)" \
  test "$steps" = 4000
check "the chief recovered globally from the lost PS" \
  bash -c "tail -n +$SB0 $WORK/chief.log | grep -q 'ps:1 (.*) was lost: training paused'"
check "the chief breaks every worker's ring as the recovery starts" \
  bash -c "tail -n +$SB0 $WORK/chief.log | grep -q 'every worker.s ring breaks now (a parameter server was lost'"
# each ring broke after the loss: by the chief's break, or first by the
# closure that failed at the lost PS (which tells its ring too)
ring_broken() { # worker, first line
  tail -n +"$2" "$WORK/worker$1.log" |
    grep -Eq 'collective group .* broken: .*(the chief broke the ring: a parameter server was lost|ps:1 \()'
}
check "both workers' rings broke after the PS was lost" \
  bash -c "$(declare -f ring_broken); WORK=$WORK; ring_broken 0 $W0 && ring_broken 1 $W1"

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
