#!/usr/bin/env bash
# A checkpoint that a lost PS ends while the chief is still making its
# folder is asked of no PS, least of all of that PS started again (async,
# 2 PS, 2 workers, the diabetes job). Once the first checkpoint is
# committed, the chief's making of checkpoint folders is held at a gate
# (its test hook TESSERA_TEST_FOLDER_GATE); ps:1 is killed with -9, which
# ends the checkpoint whose folder is held, and started again with its own
# writing held at a gate (TESSERA_TEST_SAVE_GATE). Once ps:1 has restored alone, the folder gate opens:
#   - the chief says the ended checkpoint is asked of no PS (a save of it
#     reached ps:1, which held it "being written" with nobody waiting, and
#     every later checkpoint failed on it: "one save at a time");
#   - the run ends with the exact step count and its final checkpoint, and
#     no checkpoint failed but the ended one.
# (The checkpoint taken again at the same step once ps:1 is back is a save
# of that step too, so the steps ps:1 held cannot tell the two apart.)
. "$(dirname "$0")/lib.sh"

STEPS=20000
write_diabetes_job "$WORK/job.json" ", \"steps\": $STEPS, \"steps_per_closure\": 20,
  \"checkpoint\": {\"dir\": \"ckpt\", \"every_steps\": 2000, \"keep\": 100}"
FGATE="$WORK/folder_gate"
SGATE="$WORK/save_gate"

cluster 2 2
start_all
TESSERA_TEST_FOLDER_GATE="$FGATE" start_chief --job "$WORK/job.json" \
  --summary-json "$WORK/s.json"
check "the checkpoint of step 0 is committed" \
  wait_for 60 test -f "$WORK/ckpt/ckpt-000000000000/manifest.json"
touch "$FGATE"
check "the chief holds the next checkpoint's folder" \
  wait_for 60 test -f "$FGATE.held"
kill -9 "${PIDS[ps1]}"
wait "${PIDS[ps1]}" 2>/dev/null
ended() {
  sed -n 's/.*checkpoint of step \([0-9]*\) failed: a parameter server was lost.*/\1/p' \
    "$WORK/chief.log" | head -n 1 | grep .
}
check "the lost PS ends the checkpoint being taken" wait_for 60 ended
N=$(ended)
touch "$SGATE"
TESSERA_TEST_SAVE_GATE="$SGATE" start_ps 1
restored() { grep -q "alone restored the checkpoint of step" "$WORK/chief.log"; }
check "ps:1 restored alone" wait_for 60 restored
rm -f "$FGATE"
unasked() { grep -q "checkpoint of step $N: ended .* no PS is asked" "$WORK/chief.log"; }
check "the chief asks no PS for the ended checkpoint of step $N" \
  wait_for 60 unasked
rm -f "$SGATE"
wait_chief 240
check "the chief exits 0" test "$CHIEF_RC" = 0
check "exact step count" test "$(json_get "$WORK/s.json" steps)" = $STEPS
check "the final checkpoint is committed" test "$(ckpt_step "$WORK/ckpt")" = $STEPS
check "no later checkpoint failed on a save nobody waits for" \
  bash -c "! grep -q 'still being written here' '$WORK/chief.log'"
failed=$(grep -c "checkpoint of step [0-9]* failed" "$WORK/chief.log")
check "no checkpoint failed but the ended one ($failed)" test "$failed" = 1
finish
