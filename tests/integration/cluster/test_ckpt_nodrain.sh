#!/usr/bin/env bash
# Checkpoints that do not stop training. Every PS holds its writing at a
# gate file (TESSERA_TEST_SAVE_GATE, the PS's test hook) from the first
# checkpoint on, so a checkpoint stays "being written" for as long as the
# test likes, whatever the disk's speed. Async: training goes on from the
# first checkpoint's snapshot (step 0) to many checkpoint intervals past
# it while no checkpoint is committed (the chief used to drain every
# closure and wait for the files). Sync: training goes on once every PS
# holds its snapshot, up to the next checkpoint (sync takes one every N
# steps exactly, waiting for the one before when the disk is slower). Then
# the gate opens: the held checkpoint commits, the later
# ones follow, the run ends with the exact step count, no checkpoint
# failed, and the newest is intact (tessera ckpt inspect --verify). The
# wait for the steps (120 s) is shorter than the chief's deadline for a
# checkpoint (170 s), so a chief that waits for the files cannot pass it
# by giving up on the checkpoint.
. "$(dirname "$0")/lib.sh"

# the chief's global step, from `tessera status` (-1: not yet)
status_step() {
  TF_CONFIG="{\"cluster\":$CLUSTER}" "$TESSERA" status 2>/dev/null |
    sed -n 's/^chief:0 .* step \([0-9]*\)\/.*/\1/p' | head -n 1 | grep . ||
    echo -1
}

# steps_past N CKDIR: the chief counts at least N steps with nothing
# committed in CKDIR yet
steps_past() {
  [ "$(ckpt_step "$2")" = -1 ] && [ "$(status_step)" -ge "$1" ]
}

run_mode() { # mode steps every intervals
  local mode=$1 steps=$2 every=$3 past=$(($3 * $4))
  local ck="$WORK/ck_$mode"
  touch "$WORK/gate"
  write_diabetes_job "$WORK/job_$mode.json" ", \"steps\": $steps,
    \"steps_per_closure\": 20, \"mode\": \"$mode\",
    \"checkpoint\": {\"dir\": \"ck_$mode\", \"every_steps\": $every, \"keep\": 2}"
  cluster 2 2
  TESSERA_TEST_SAVE_GATE="$WORK/gate" start_all
  start_chief --job "$WORK/job_$mode.json" --summary-json "$WORK/s_$mode.json"
  check "$mode: $past steps trained while the first checkpoint's files are held" \
    wait_for 120 steps_past "$past" "$ck"
  check "$mode: nothing committed while the gate is shut" \
    test "$(ckpt_step "$ck")" = -1
  rm -f "$WORK/gate"
  wait_chief 300
  check "$mode: the run ends (exit 0)" test "$CHIEF_RC" = 0
  check "$mode: exact step count" \
    test "$(json_get "$WORK/s_$mode.json" steps)" = "$steps"
  check "$mode: the last checkpoint is the final step" \
    test "$(ckpt_step "$ck")" = "$steps"
  check "$mode: no checkpoint failed" \
    test "$(json_get "$WORK/s_$mode.json" checkpoints.failed)" = "[]"
  check "$mode: the newest checkpoint is intact" \
    "$TESSERA" ckpt inspect --verify "$ck" >"$WORK/inspect_$mode.log" 2>&1
  for k in "${!PIDS[@]}"; do kill -9 "${PIDS[$k]}" 2>/dev/null; done
  wait 2>/dev/null
  PIDS=()
}

run_mode async 6000 300 3
run_mode sync 1500 100 1
finish
