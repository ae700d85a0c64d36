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
# failed, the newest is intact (tessera ckpt inspect --verify), and each
# manifest counts the examples of its own step, not those trained while
# its files were written (a chief resumed from it counts on from there). The
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

# every committed checkpoint in CKDIR whose manifest counts more examples
# than its steps' batches hold (PER_STEP a step: 32 in async, where a step
# is one worker's; 64 in sync, where it is both workers'): training went on
# while its files were written, and those examples belong to later
# checkpoints
too_many_examples() { # ckdir per_step
  /usr/bin/python3 - "$1" "$2" <<'PY'
import glob, json, os, sys
per = int(sys.argv[2])
for m in sorted(glob.glob(os.path.join(sys.argv[1], "ckpt-*", "manifest.json"))):
    j = json.load(open(m))
    if j["examples"] > j["step"] * per:
        print(f"{m}: {j['examples']} examples at step {j['step']}")
PY
}

run_mode() { # mode steps every intervals keep
  local mode=$1 steps=$2 every=$3 past=$(($3 * $4)) keep=$5
  local ck="$WORK/ck_$mode"
  touch "$WORK/gate"
  write_diabetes_job "$WORK/job_$mode.json" ", \"steps\": $steps,
    \"steps_per_closure\": 20, \"mode\": \"$mode\",
    \"checkpoint\": {\"dir\": \"ck_$mode\", \"every_steps\": $every, \"keep\": $keep}"
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
  local per=32
  [ "$mode" = sync ] && per=64
  too_many_examples "$ck" "$per" >"$WORK/examples_$mode.txt"
  check "$mode: each manifest counts the examples of its own step ($(head -c 200 "$WORK/examples_$mode.txt"))" \
    test ! -s "$WORK/examples_$mode.txt"
  for k in "${!PIDS[@]}"; do kill -9 "${PIDS[$k]}" 2>/dev/null; done
  wait 2>/dev/null
  PIDS=()
}

# async keeps every checkpoint, the one held from step 0 among them
run_mode async 6000 300 3 100
run_mode sync 1500 100 1 2
finish
