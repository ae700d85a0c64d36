#!/usr/bin/env bash
# What the chief decides when things go wrong, on real clusters started
# from TF_CONFIG (the diabetes job, epochs-based like every shipped job):
#  1. a chief killed after a checkpoint and started again goes on from that
#     checkpoint's step (it re-trained from step 0 when the rewind came
#     before the workers had said how much data they have);
#  2. the finished job run again on its checkpoint folder trains nothing,
#     says so, evaluates and exits 0;
#  3. the newest checkpoint's shard files gone: each failed restore is one
#     line naming the PS and its reason, three tries, then the next older
#     checkpoint; with every checkpoint broken the run fails, saying why;
#  4. bad data (a value float32 cannot hold, a cell that is not a number, a
#     missing file, a label out of range in the eval file): the run stops
#     naming the file, line and column, with standalone's exit status.
# A full disk is test_disk_full.sh.
. "$(dirname "$0")/lib.sh"

last_error() { grep ' ERROR ' "$1" | tail -n 1; }
stop_cluster() {
  local k
  for k in "${!PIDS[@]}"; do kill -9 "${PIDS[$k]}" 2>/dev/null; unset "PIDS[$k]"; done
  wait 2>/dev/null
}

# ---- 1. a restarted chief on an epochs job --------------------------------
write_diabetes_job "$WORK/job.json" ', "epochs": 300, "steps_per_closure": 20,
  "checkpoint": {"dir": "ckpt", "every_steps": 400, "keep": 3}'
cluster 2 2
start_all
start_chief --job "$WORK/job.json" --summary-json "$WORK/s1.json"
past_800() { [ "$(ckpt_step "$WORK/ckpt")" -ge 800 ]; }
check "resume: a checkpoint past step 800" wait_for 120 past_800
kill -9 "$CHIEF_PID"
wait "$CHIEF_PID" 2>/dev/null
at=$(ckpt_step "$WORK/ckpt")
mv "$WORK/chief.log" "$WORK/chief1a.log.txt"
start_chief --job "$WORK/job.json" --summary-json "$WORK/s1.json"
wait_chief 240
total=$(json_get "$WORK/s1.json" steps 2>/dev/null || echo 0)
run=$(json_get "$WORK/s1.json" steps_run 2>/dev/null || echo -1)
echo "resumed at $at of $total; steps run after the restart: $run"
check "resume: exits 0" test "$CHIEF_RC" = 0
check "resume: from the checkpoint of step $at" \
  test "$(json_get "$WORK/s1.json" resumed_from_step)" = "$at"
check "resume: goes on from step $at, not from 0" \
  grep -q "training goes on from step $at of $total" "$WORK/chief.log"
check "resume: trains only the steps after it ($run = $total - $at)" \
  test "$run" = $((total - at))
ex=$(json_get "$WORK/s1.json" examples)
check "resume: no more examples than steps x batch ($ex <= $((total * 32)))" \
  test "$ex" -le $((total * 32))
mv "$WORK/chief.log" "$WORK/chief1b.log.txt"

# ---- 2. the finished job run again ----------------------------------------
# (the first run's end told its PS and workers to exit: a fresh cluster)
stop_cluster
before=$(ls -d "$WORK"/ckpt/ckpt-* | wc -l)
cluster 2 2
start_all
start_chief --job "$WORK/job.json" --summary-json "$WORK/s2.json"
wait_chief 120
check "done job: exits 0" test "$CHIEF_RC" = 0
check "done job: says it is done" grep -q "the job is already done" "$WORK/chief.log"
check "done job: trains nothing" test "$(json_get "$WORK/s2.json" steps_run)" = 0
check "done job: the examples of the finished run, no more" \
  test "$(json_get "$WORK/s2.json" examples)" = "$ex"
check "done job: evaluates" grep -q "eval at step $total" "$WORK/chief.log"
check "done job: no new checkpoint" test "$(ls -d "$WORK"/ckpt/ckpt-* | wc -l)" = "$before"
stop_cluster
mv "$WORK/chief.log" "$WORK/chief2.log.txt"

# ---- 3. restores that fail ------------------------------------------------
newest=$(ckpt_step "$WORK/ckpt")
rm -f "$WORK/ckpt/ckpt-$(printf '%012d' "$newest")"/*.tshard
older=$(for d in "$WORK"/ckpt/ckpt-*; do s=$((10#${d##*ckpt-})); [ "$s" -lt "$newest" ] && echo "$s"; done | sort -n | tail -1)
write_diabetes_job "$WORK/job.json" ', "epochs": 400, "steps_per_closure": 20,
  "checkpoint": {"dir": "ckpt", "every_steps": 400, "keep": 3}'
cluster 2 2
start_all
start_chief --job "$WORK/job.json" --summary-json "$WORK/s3.json"
wait_chief 240
check "fallback: exits 0" test "$CHIEF_RC" = 0
check "fallback: one line per failed try, naming the PS" \
  test "$(grep -c "restoring the checkpoint of step $newest failed (try [123] of 3): ps:[01] ([^)]*): restore: " "$WORK/chief.log")" = 3
check "fallback: to the checkpoint of step $older" \
  grep -q "falling back to the checkpoint of step $older" "$WORK/chief.log"
check "fallback: resumed from step $older" \
  test "$(json_get "$WORK/s3.json" resumed_from_step)" = "$older"
stop_cluster
mv "$WORK/chief.log" "$WORK/chief3a.log.txt"

for d in "$WORK"/ckpt/ckpt-*; do rm -f "$d"/*.tshard; done
cluster 2 2
start_all
t0=$SECONDS
start_chief --job "$WORK/job.json" --summary-json "$WORK/s3b.json"
wait_chief 120
echo "every checkpoint broken: $(last_error "$WORK/chief.log")"
check "no good checkpoint: fails (exit 1)" test "$CHIEF_RC" = 1
check "no good checkpoint: within a bounded time" test $((SECONDS - t0)) -lt 100
check "no good checkpoint: the reason names the PS and what failed" \
  bash -c "grep ' ERROR ' '$WORK/chief.log' | tail -1 | grep -q 'could not be restored.*ps:[01] (.*restore: '"
stop_cluster
mv "$WORK/chief.log" "$WORK/chief3b.log.txt"
rm -rf "$WORK/ckpt"

# ---- 4. bad data ----------------------------------------------------------
# bad_csv NAME: a copy of the diabetes set with one bad cell
/usr/bin/python3 - "$WORK" <<'PY'
import sys
w = sys.argv[1]
rows = open(w + "/diabetes.csv").read().splitlines()
def bad(name, row, col, value):
    r = list(rows)
    c = r[row].split(","); c[col] = value; r[row] = ",".join(c)
    open(f"{w}/{name}.csv", "w").write("\n".join(r) + "\n")
bad("overflow", 7, 2, "1e39")
bad("text", 9, 3, "n/a")
PY
check_data_error() { # name, job file, what the error must name
  local name=$1 job=$2 want=$3
  TESSERA_LOG=error "$WK_BIN" --standalone --job "$job" --device cpu --steps 20 \
    >"$WORK/sa_$name.log.txt" 2>&1
  local sa=$?
  cluster 2 2
  start_all
  start_chief --job "$job" --summary-json "$WORK/s_$name.json"
  wait_chief 120
  echo "$name: standalone exit $sa, chief exit $CHIEF_RC: $(last_error "$WORK/chief.log")"
  check "$name: the run stops with standalone's exit status ($sa)" \
    test "$CHIEF_RC" = "$sa" -a "$sa" = 3
  check "$name: the chief names it ($want)" \
    bash -c "grep ' ERROR ' '$WORK/chief.log' | tail -1 | grep -qF -- '$want'"
  stop_cluster
  mv "$WORK/chief.log" "$WORK/chief4_$name.log.txt"
}
for name in overflow text; do
  write_diabetes_job "$WORK/job_$name.json" ', "epochs": 5'
  sed -i "s/\"diabetes.csv\"/\"$name.csv\"/" "$WORK/job_$name.json"
done
write_diabetes_job "$WORK/job_missing.json" ', "epochs": 5'
sed -i 's/"diabetes.csv"/"no_such_file.csv"/' "$WORK/job_missing.json"
check_data_error overflow "$WORK/job_overflow.json" 'overflow.csv: line 8 (data row 6), column 3 ("bmi"): "1e39" overflows float32'
check_data_error text "$WORK/job_text.json" 'text.csv: line 10 (data row 8), column 4 ("bp"): "n/a" is not a number'
check_data_error missing "$WORK/job_missing.json" 'no_such_file.csv'
# a classifier whose eval file holds a label that is not a class
/usr/bin/python3 - "$WORK" "$SRC/tests/data/digits.csv" <<'PY'
import json, sys
w, src = sys.argv[1], sys.argv[2]
rows = open(src).read().splitlines()
open(w + "/digits_train.csv", "w").write("\n".join(rows[:801]) + "\n")
ev = [rows[0]] + rows[801:901]
c = ev[5].split(","); c[-1] = "12"; ev[5] = ",".join(c)
open(w + "/digits_eval.csv", "w").write("\n".join(ev) + "\n")
job = {"model": {"class_name": "Sequential", "config": {"layers": [
          {"class_name": "InputLayer", "config": {"batch_input_shape": [None, 64]}},
          {"class_name": "Dense", "config": {"units": 10, "activation": "softmax"}}]}},
       "loss": "sparse_categorical_crossentropy", "batch_size": 32, "epochs": 3,
       "data": {"train": {"format": "csv", "paths": "digits_train.csv",
                          "label": "label", "scale": 0.0625},
                "eval": {"format": "csv", "paths": "digits_eval.csv",
                         "label": "label", "scale": 0.0625}}}
json.dump(job, open(w + "/job_label.json", "w"))
PY
check_data_error label "$WORK/job_label.json" 'digits_eval.csv: line 6 (data row 4), column "label" (the label): 12 is not a class in [0, 10)'

finish
