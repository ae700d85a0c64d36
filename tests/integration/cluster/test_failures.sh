#!/usr/bin/env bash
# Failures, each on a real cluster started from TF_CONFIG:
#  1. kill -9 a worker mid-run and start it again: the run completes with
#     the exact step count and the chief counts the worker's return;
#  2. kill -9 a PS mid-run and start it again: the chief pauses, every PS
#     restores the last checkpoint, the run resumes from it and completes;
#  3. kill -9 the chief mid-run and start it again: it resumes from the
#     latest checkpoint and completes;
#  4. the last checkpoint, made on 2 PS, restored onto 3 PS by a new run;
#  5, 6. in sync mode, a PS and then a worker killed and started again: the
#     run completes with the exact step count (the PS case recovers from the
#     checkpoint; the worker that comes back joins again and runs steps);
#  7. in sync mode, the chief and a worker killed together and started
#     again: the chief resumes from its checkpoint, every PS with it, and
#     no call waits out its deadline;
#  8. in ssp:2, both workers killed at once and started again: the run
#     completes, no call waits out its deadline.
. "$(dirname "$0")/lib.sh"

STEPS=30000
started() { grep -q "ready on" "$WORK/chief.log" 2>/dev/null; }
past_ckpt() { [ "$(ckpt_step "$WORK/ckpt")" -gt 0 ]; }

# ---- 1. a worker dies ------------------------------------------------------
write_diabetes_job "$WORK/job.json" ", \"steps\": $STEPS, \"steps_per_closure\": 20"
cluster 2 2
start_all
start_chief --job "$WORK/job.json" --summary-json "$WORK/s1.json"
check "worker kill: training started" wait_for 60 started
sleep 1
status=$(TF_CONFIG="{\"cluster\":$CLUSTER}" "$TESSERA" status)
echo "$status"
check "status: the chief is training" grep -q "^chief:0 .* train " <<<"$status"
check "status: both PS answer" test "$(grep -c '^ps:[01] .* up ' <<<"$status")" = 2
check "status: both workers answer" test "$(grep -c '^worker:[01] .* running\|^worker:[01] .* configured' <<<"$status")" = 2
kill -9 "${PIDS[worker1]}"
sleep 1
start_worker 1
wait_chief 240
check "worker kill: chief exits 0" test "$CHIEF_RC" = 0
check "worker kill: exact step count" test "$(json_get "$WORK/s1.json" steps)" = $STEPS
check "worker kill: the return is counted" test "$(json_get "$WORK/s1.json" restarts.worker)" -ge 1
check "worker kill: the chief said so" grep -q "lost worker:1" "$WORK/chief.log"
for k in "${!PIDS[@]}"; do kill -9 "${PIDS[$k]}" 2>/dev/null; unset "PIDS[$k]"; done
wait 2>/dev/null
mv "$WORK/chief.log" "$WORK/chief1.log.txt"

# ---- 2. a PS dies ----------------------------------------------------------
write_diabetes_job "$WORK/job.json" ", \"steps\": $STEPS, \"steps_per_closure\": 20,
  \"checkpoint\": {\"dir\": \"ckpt\", \"every_steps\": 2000}"
cluster 2 2
start_all
start_chief --job "$WORK/job.json" --summary-json "$WORK/s2.json"
check "ps kill: a checkpoint past step 0" wait_for 60 past_ckpt
kill -9 "${PIDS[ps1]}"
sleep 1
start_ps 1
wait_chief 240
check "ps kill: chief exits 0" test "$CHIEF_RC" = 0
check "ps kill: exact step count" test "$(json_get "$WORK/s2.json" steps)" = $STEPS
check "ps kill: one recovery" test "$(json_get "$WORK/s2.json" restarts.ps)" -ge 1
check "ps kill: restored from a checkpoint" grep -q "restored the checkpoint of step" "$WORK/chief.log"
check "ps kill: final checkpoint" test "$(ckpt_step "$WORK/ckpt")" = $STEPS
for k in "${!PIDS[@]}"; do kill -9 "${PIDS[$k]}" 2>/dev/null; unset "PIDS[$k]"; done
wait 2>/dev/null
mv "$WORK/chief.log" "$WORK/chief2.log.txt"
rm -rf "$WORK/ckpt"

# ---- 3. the chief dies -----------------------------------------------------
cluster 2 2
start_all
start_chief --job "$WORK/job.json" --summary-json "$WORK/s3.json"
check "chief kill: a checkpoint past step 0" wait_for 60 past_ckpt
kill -9 "$CHIEF_PID"
wait "$CHIEF_PID" 2>/dev/null
at=$(ckpt_step "$WORK/ckpt")
start_chief --job "$WORK/job.json" --summary-json "$WORK/s3.json"
wait_chief 240
check "chief restart: exits 0" test "$CHIEF_RC" = 0
check "chief restart: resumed from the checkpoint of step $at" \
  test "$(json_get "$WORK/s3.json" resumed_from_step)" -ge "$at"
check "chief restart: exact step count" test "$(json_get "$WORK/s3.json" steps)" = $STEPS
for k in "${!PIDS[@]}"; do kill -9 "${PIDS[$k]}" 2>/dev/null; unset "PIDS[$k]"; done
wait 2>/dev/null
mv "$WORK/chief.log" "$WORK/chief3.log.txt"

# ---- 4. the checkpoint made on 2 PS restored onto 3 --------------------------
cluster 3 2
start_all
start_chief --job "$WORK/job.json" --steps $((STEPS + 2000)) \
  --summary-json "$WORK/s4.json"
wait_chief 240
check "3 PS: exits 0" test "$CHIEF_RC" = 0
check "3 PS: resumed from the 2-PS checkpoint of step $STEPS" \
  test "$(json_get "$WORK/s4.json" resumed_from_step)" = $STEPS
check "3 PS: exact step count" test "$(json_get "$WORK/s4.json" steps)" = $((STEPS + 2000))
loss=$(json_get "$WORK/s4.json" eval.loss 2>/dev/null || echo 1e9)
check "3 PS: the restored model is the trained one (test MSE $loss <= 4000)" \
  /usr/bin/python3 -c "import sys; sys.exit(0 if float('$loss') <= 4000 else 1)"
for k in "${!PIDS[@]}"; do kill -9 "${PIDS[$k]}" 2>/dev/null; unset "PIDS[$k]"; done
wait 2>/dev/null
mv "$WORK/chief.log" "$WORK/chief4.log.txt"
rm -rf "$WORK/ckpt"

# no call of the run waited out its deadline (a hang that a deadline ends)
no_deadline() { ! grep -q "deadline of" "$WORK"/worker*.log "$WORK/chief.log"; }

# ---- 5, 6. sync mode: a PS, then a worker, killed and started again ---------
# The worker's run is long enough to outlast its restart: one worker
# alone trains this job at up to ~3,000 steps/s here, and with 6,000
# steps the run once ended 0.1 s after the worker was back, before it
# ran a step.
sync_job() { # steps: the sync job in $WORK/job.json, SSTEPS
  SSTEPS=$1
  write_diabetes_job "$WORK/job.json" ", \"steps\": $SSTEPS, \"steps_per_closure\": 20,
    \"mode\": \"sync\", \"checkpoint\": {\"dir\": \"ckpt\", \"every_steps\": 1000}"
}
for victim in ps1 worker1; do
  if [ "$victim" = worker1 ]; then sync_job 40000; else sync_job 6000; fi
  cluster 2 2
  : >"$WORK/worker0.log"; : >"$WORK/worker1.log"
  start_all
  start_chief --job "$WORK/job.json" --summary-json "$WORK/s_$victim.json" \
    --keep-cluster
  check "sync, $victim killed: a checkpoint past step 0" wait_for 60 past_ckpt
  kill -9 "${PIDS[$victim]}"
  sleep 1
  if [ "$victim" = ps1 ]; then start_ps 1; else start_worker 1; fi
  wait_chief 240
  check "sync, $victim killed: chief exits 0" test "$CHIEF_RC" = 0
  check "sync, $victim killed: exact step count" \
    test "$(json_get "$WORK/s_$victim.json" steps 2>/dev/null)" = $SSTEPS
  check "sync, $victim killed: no call waited out its deadline" no_deadline
  if [ "$victim" = worker1 ]; then
    st=$(TF_CONFIG="{\"cluster\":$CLUSTER}" "$TESSERA" status 2>&1)
    w1=$(sed -n 's/^worker:1 .* \([0-9][0-9]*\) steps.*/\1/p' <<<"$st" | head -1)
    check "sync, worker1 back: it joins again and runs steps (${w1:-0})" \
      test "${w1:-0}" -gt 0
  fi
  for k in "${!PIDS[@]}"; do kill -9 "${PIDS[$k]}" 2>/dev/null; unset "PIDS[$k]"; done
  wait 2>/dev/null
  mv "$WORK/chief.log" "$WORK/chief_sync_$victim.log.txt"
  rm -rf "$WORK/ckpt"
done

# ---- 7. sync mode: the chief and a worker killed together -------------------
sync_job 6000
cluster 2 2
: >"$WORK/worker0.log"; : >"$WORK/worker1.log"
start_all
start_chief --job "$WORK/job.json" --summary-json "$WORK/s7.json"
check "sync, chief+worker1: a checkpoint past step 0" wait_for 60 past_ckpt
kill -9 "$CHIEF_PID" "${PIDS[worker1]}"
wait "$CHIEF_PID" "${PIDS[worker1]}" 2>/dev/null
at=$(ckpt_step "$WORK/ckpt")
start_worker 1
start_chief --job "$WORK/job.json" --summary-json "$WORK/s7.json"
wait_chief 240
check "sync, chief+worker1: chief exits 0" test "$CHIEF_RC" = 0
check "sync, chief+worker1: resumed from the checkpoint of step $at" \
  test "$(json_get "$WORK/s7.json" resumed_from_step 2>/dev/null)" -ge "$at"
check "sync, chief+worker1: exact step count" \
  test "$(json_get "$WORK/s7.json" steps 2>/dev/null)" = $SSTEPS
check "sync, chief+worker1: no call waited out its deadline" no_deadline
for k in "${!PIDS[@]}"; do kill -9 "${PIDS[$k]}" 2>/dev/null; unset "PIDS[$k]"; done
wait 2>/dev/null
mv "$WORK/chief.log" "$WORK/chief7.log.txt"
rm -rf "$WORK/ckpt"

# ---- 8. ssp:2: both workers killed at once ------------------------------------
write_diabetes_job "$WORK/job.json" ", \"steps\": $SSTEPS, \"steps_per_closure\": 20,
  \"mode\": \"ssp:2\", \"checkpoint\": {\"dir\": \"ckpt\", \"every_steps\": 1000}"
cluster 2 2
: >"$WORK/worker0.log"; : >"$WORK/worker1.log"
start_all
start_chief --job "$WORK/job.json" --summary-json "$WORK/s8.json"
check "ssp:2, both workers: training started" wait_for 60 started
sleep 1
kill -9 "${PIDS[worker0]}" "${PIDS[worker1]}"
wait "${PIDS[worker0]}" "${PIDS[worker1]}" 2>/dev/null
sleep 1
start_worker 0
start_worker 1
wait_chief 240
check "ssp:2, both workers: chief exits 0" test "$CHIEF_RC" = 0
check "ssp:2, both workers: exact step count" \
  test "$(json_get "$WORK/s8.json" steps 2>/dev/null)" = $SSTEPS
check "ssp:2, both workers: no call waited out its deadline" no_deadline
for k in "${!PIDS[@]}"; do kill -9 "${PIDS[$k]}" 2>/dev/null; unset "PIDS[$k]"; done
wait 2>/dev/null
mv "$WORK/chief.log" "$WORK/chief8.log.txt"
rm -rf "$WORK/ckpt"
finish
