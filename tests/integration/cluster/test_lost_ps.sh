#!/usr/bin/env bash
# A PS lost in async mode costs only that PS: 3 PS and 2 workers, a PS
# killed with -9 some steps after a checkpoint and started again.
#  1. The run ends with the exact step count and no step counted twice
#     (steps_run == steps: nothing rewound); the chief says the PS alone
#     restored the checkpoint and never pauses or rewinds the others; in
#     the final checkpoint every shard of the two PS that stayed up was
#     applied exactly once per step (its applies == the steps: no step
#     re-done there), the restarted one's fewer (what it learned between
#     the checkpoint and its loss is gone, nothing else).
#  2. Two of the three PS killed at once: each restores its own shards.
#  3. A PS killed, and the chief killed while it is down: the new chief
#     resumes from the last checkpoint with every PS, as it always does.
. "$(dirname "$0")/lib.sh"

STEPS=12000
past_ckpt() { [ "$(ckpt_step "$WORK/ckpt")" -gt 0 ]; }
status_step() {
  TF_CONFIG="{\"cluster\":$CLUSTER}" "$TESSERA" status 2>/dev/null |
    sed -n 's|^chief:0 .* step \([0-9]*\)/.*|\1|p'
}
# some steps past the newest checkpoint (so the lost PS has work to lose)
past_by() {
  local s c
  s=$(status_step)
  c=$(ckpt_step "$WORK/ckpt")
  [ -n "$s" ] && [ "$s" -gt $((c + $1)) ]
}
restored_alone() { grep -q "alone restored the checkpoint of step" "$WORK/chief.log"; }

# applies VAR: the applies of variable VAR in the newest checkpoint
applies() {
  "$TESSERA" ckpt inspect "$WORK/ckpt" 2>/dev/null |
    awk -v v="$1" '$1 == v {print $(NF - 1)}'
}
# vars_on PS: the variables whose files PS wrote in the newest checkpoint
vars_on() {
  local d
  d=$(ls -d "$WORK"/ckpt/ckpt-* | sort | tail -1)
  /usr/bin/python3 - "$d/manifest.json" "$1" <<'PY'
import json, sys, urllib.parse
m = json.load(open(sys.argv[1]))
for f in m["files"]:
    if f["ps"] == int(sys.argv[2]):
        print(urllib.parse.unquote(f["name"]).split(".part-")[0])
PY
}

write_diabetes_job "$WORK/job.json" ", \"steps\": $STEPS, \"steps_per_closure\": 20,
  \"checkpoint\": {\"dir\": \"ckpt\", \"every_steps\": 3000}"

# ---- 1. one PS --------------------------------------------------------------
cluster 3 2
start_all
start_chief --job "$WORK/job.json" --summary-json "$WORK/s1.json"
check "one PS: a checkpoint past step 0" wait_for 60 past_ckpt
check "one PS: 200 steps past it" wait_for 60 past_by 200
kill -9 "${PIDS[ps1]}"
wait "${PIDS[ps1]}" 2>/dev/null
sleep 1
start_ps 1
check "one PS: restored alone" wait_for 60 restored_alone
wait_chief 240
check "one PS: chief exits 0" test "$CHIEF_RC" = 0
check "one PS: exact step count" test "$(json_get "$WORK/s1.json" steps)" = $STEPS
check "one PS: no step counted twice (nothing rewound)" \
  test "$(json_get "$WORK/s1.json" steps_run)" = $STEPS
check "one PS: one PS recovery" test "$(json_get "$WORK/s1.json" restarts.ps)" = 1
check "one PS: no pause, no rewind" \
  bash -c "! grep -q 'training paused\|resuming from there' '$WORK/chief.log'"
check "one PS: final checkpoint" test "$(ckpt_step "$WORK/ckpt")" = $STEPS
for p in 0 2; do
  for v in $(vars_on $p); do
    check "one PS: $v on ps:$p, up all along, applied once per step" \
      test "$(applies "$v")" = $STEPS
  done
done
for v in $(vars_on 1); do
  a=$(applies "$v")
  check "one PS: $v on the restarted ps:1 lost its work since the checkpoint ($a)" \
    test "${a:-0}" -gt 0 -a "${a:-0}" -lt $STEPS
done
for k in "${!PIDS[@]}"; do kill -9 "${PIDS[$k]}" 2>/dev/null; unset "PIDS[$k]"; done
wait 2>/dev/null
mv "$WORK/chief.log" "$WORK/chief1.log.txt"
rm -rf "$WORK/ckpt"

# ---- 2. two of the three PS at once -------------------------------------------
cluster 3 2
start_all
start_chief --job "$WORK/job.json" --summary-json "$WORK/s2.json"
check "two PS: a checkpoint past step 0" wait_for 60 past_ckpt
kill -9 "${PIDS[ps0]}" "${PIDS[ps2]}"
wait "${PIDS[ps0]}" "${PIDS[ps2]}" 2>/dev/null
sleep 1
start_ps 0
start_ps 2
wait_chief 240
check "two PS: chief exits 0" test "$CHIEF_RC" = 0
check "two PS: exact step count" test "$(json_get "$WORK/s2.json" steps)" = $STEPS
check "two PS: nothing rewound" test "$(json_get "$WORK/s2.json" steps_run)" = $STEPS
check "two PS: each restored alone" \
  test "$(grep -c "alone restored the checkpoint of step" "$WORK/chief.log")" = 2
for k in "${!PIDS[@]}"; do kill -9 "${PIDS[$k]}" 2>/dev/null; unset "PIDS[$k]"; done
wait 2>/dev/null
mv "$WORK/chief.log" "$WORK/chief2.log.txt"
rm -rf "$WORK/ckpt"

# ---- 3. the chief dies while a PS is down ---------------------------------------
lost_noted() { grep -q "ps:1 .* is lost: training goes on" "$WORK/chief.log"; }
cluster 3 2
start_all
start_chief --job "$WORK/job.json" --summary-json "$WORK/s3.json"
check "chief while a PS is down: a checkpoint past step 0" wait_for 60 past_ckpt
kill -9 "${PIDS[ps1]}"
wait "${PIDS[ps1]}" 2>/dev/null
check "chief while a PS is down: the PS loss noted" wait_for 60 lost_noted
kill -9 "$CHIEF_PID"
wait "$CHIEF_PID" 2>/dev/null
at=$(ckpt_step "$WORK/ckpt")
start_ps 1
start_chief --job "$WORK/job.json" --summary-json "$WORK/s3.json"
wait_chief 240
check "chief while a PS is down: exits 0" test "$CHIEF_RC" = 0
check "chief while a PS is down: resumed from the checkpoint of step $at" \
  test "$(json_get "$WORK/s3.json" resumed_from_step)" -ge "$at"
check "chief while a PS is down: exact step count" \
  test "$(json_get "$WORK/s3.json" steps)" = $STEPS
for k in "${!PIDS[@]}"; do kill -9 "${PIDS[$k]}" 2>/dev/null; unset "PIDS[$k]"; done
wait 2>/dev/null
mv "$WORK/chief.log" "$WORK/chief3.log.txt"
finish
