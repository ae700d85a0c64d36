#!/usr/bin/env bash
# A worker lost for good: killed with -9 and not started again, in async,
# ssp:2 and sync mode, and (sync) stopped with SIGSTOP so it is silent but
# its sockets stay open. Its closures must run on the other worker at once:
# the run ends with the exact step count, a checkpoint is committed after
# the loss, and nothing waits out the closure deadline. The deadline is set
# to an hour, so a run that waited for the lost worker's closures (the
# pause before the next checkpoint did, until that deadline) cannot end
# within this test's wait. `tessera status` names the lost worker and why.
. "$(dirname "$0")/lib.sh"

past_ckpt() { [ "$(ckpt_step "$WORK/ckpt")" -gt 0 ]; }
lost_noted() { grep -q "lost worker:1" "$WORK/chief.log"; }

# the line number of the first line matching $1 in the chief's log (0: none)
line_of() { grep -n -m1 -- "$1" "$WORK/chief.log" | cut -d: -f1 || true; }

# run MODE STEPS HOW: HOW is kill (kill -9) or stop (SIGSTOP, silent)
run() {
  local mode=$1 steps=$2 how=$3 name="$1, worker:1 $3"
  write_diabetes_job "$WORK/job.json" ", \"steps\": $steps, \"steps_per_closure\": 20,
    \"mode\": \"$mode\", \"checkpoint\": {\"dir\": \"ckpt\", \"every_steps\": 1000}"
  cluster 2 2
  : >"$WORK/worker0.log"; : >"$WORK/worker1.log"; : >"$WORK/chief.log"
  # the chief keeps a summary of more steps (the run before's)
  rm -f "$WORK/s.json"
  start_all
  local hb=()
  [ "$how" = stop ] && hb=(--heartbeat-timeout 3)
  start_chief --job "$WORK/job.json" --summary-json "$WORK/s.json" \
    --closure-timeout 3600 "${hb[@]}"
  check "$name: a checkpoint past step 0" wait_for 60 past_ckpt
  if [ "$how" = stop ]; then
    kill -STOP "${PIDS[worker1]}"
  else
    kill -9 "${PIDS[worker1]}"
    wait "${PIDS[worker1]}" 2>/dev/null
    unset 'PIDS[worker1]'
  fi
  check "$name: the chief says it lost it" wait_for 60 lost_noted
  if [ "$mode" = async ]; then
    local st
    st=$(TF_CONFIG="{\"cluster\":$CLUSTER}" "$TESSERA" status 2>&1)
    echo "$st"
    check "$name: status names the lost worker" \
      grep -q "^worker:1 .*chief: no closures for it since .* ago: " <<<"$st"
  fi
  wait_chief 240
  check "$name: chief exits 0" test "$CHIEF_RC" = 0
  check "$name: exact step count" \
    test "$(json_get "$WORK/s.json" steps 2>/dev/null)" = "$steps"
  check "$name: its closures run on worker:0" \
    grep -q "lost worker:1 .*run now on worker:0" "$WORK/chief.log"
  local lost ck
  lost=$(line_of "lost worker:1")
  ck=$(awk -v l="${lost:-0}" 'NR > l && /checkpoint of step [0-9]+ committed/ \
                              {print NR; exit}' "$WORK/chief.log")
  check "$name: a checkpoint committed after the loss" test -n "$ck"
  check "$name: no closure waited out its deadline" \
    bash -c "! grep -q 'no answer to closure' '$WORK/chief.log'"
  check "$name: no call waited out its deadline" \
    bash -c "! grep -q 'deadline of' '$WORK/worker0.log' '$WORK/chief.log'"
  for k in "${!PIDS[@]}"; do kill -9 "${PIDS[$k]}" 2>/dev/null; unset "PIDS[$k]"; done
  wait 2>/dev/null
  mv "$WORK/chief.log" "$WORK/chief_${mode/:/}_$how.log.txt"
  rm -rf "$WORK/ckpt"
}

run async 20000 kill
run ssp:2 6000 kill
run sync 6000 kill
run sync 6000 stop
finish
