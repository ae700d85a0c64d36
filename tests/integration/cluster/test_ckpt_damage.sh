#!/usr/bin/env bash
# Checkpoints that fall back past damage, on a real cluster (2 PS, 2
# workers, the diabetes job, checkpoints every 400 steps, keep 3):
#  1. a run of 1200 steps commits checkpoints (about every 400 steps: at the
#     first closure boundary past each); `tessera ckpt inspect
#     --verify` finds them intact; the last one records the run's final
#     evaluation (its manifest waits for it);
#  1b. a chief started again after the job ended (the cluster gone, the
#     final checkpoint committed) exits 0 at once with the full step count
#     and the run's final loss, eval and examples (from the final
#     checkpoint), keeps the run's own summary where one is, and a chief
#     that fails never writes a summary of fewer steps over it;
#  2. one byte of a shard file of the newest checkpoint flipped: inspect
#     (with --verify or without) exits 1 naming the file; the next run
#     (to 1600 steps) resumes from the previous checkpoint, saying it
#     skipped the newest and why (once), and ends with the exact step count;
#  3. a shard file copied into the newest checkpoint from an older one
#     (valid CRCs): plain inspect exits 1 naming it; skipped the same way
#     ("another checkpoint");
#  4. a checkpoint whose files the chief cannot see (a PS writing to a
#     folder of its own, the job saying "shared") is never committed, and
#     the run, which asked for checkpoints and has none, exits 1 saying so.
. "$(dirname "$0")/lib.sh"

write_diabetes_job "$WORK/job.json" ', "steps": 1200, "steps_per_closure": 20,
  "checkpoint": {"dir": "ckpt", "every_steps": 400, "keep": 3}'

# the committed checkpoint steps in DIR, newest first
steps_of() {
  local d
  for d in "$1"/ckpt-*; do
    [ -f "$d/manifest.json" ] && echo $((10#${d##*ckpt-}))
  done | sort -rn
}

run() { # summary file, extra chief args
  local out=$1; shift
  cluster 2 2
  start_all
  start_chief --job "$WORK/job.json" --summary-json "$out" "$@"
  wait_chief 240
  for k in "${!PIDS[@]}"; do kill -9 "${PIDS[$k]}" 2>/dev/null; unset "PIDS[$k]"; done
  wait 2>/dev/null
}

# ---- 1. intact ---------------------------------------------------------------
run "$WORK/s1.json"
check "run 1: chief exits 0" test "$CHIEF_RC" = 0
check "run 1: newest checkpoint at step 1200" test "$(ckpt_step "$WORK/ckpt")" = 1200
out=$("$TESSERA" ckpt inspect --verify "$WORK/ckpt" 2>&1); rc=$?
check "inspect --verify: intact, exit 0" test "$rc" = 0
check "inspect --verify: says so" grep -q "all intact" <<<"$out"
# the final checkpoint's manifest waits for the final evaluation (they go
# on together): it records that one, of its own step
m="$WORK/ckpt/ckpt-000000001200/manifest.json"
check "run 1: the final checkpoint records the final evaluation's step" \
  test "$(json_get "$m" eval_step)" = 1200
check "run 1: and its loss, the summary's" \
  test "$(json_get "$m" eval.loss)" = "$(json_get "$WORK/s1.json" eval.loss)"
mv "$WORK/chief.log" "$WORK/chief1.log.txt"

# ---- 1b. a chief started again once the job had finished -----------------------
# (as one killed right after it told the cluster to stop: the cluster is
# gone, the final checkpoint committed)
rm -f "$WORK/s1b.json"
start_chief --job "$WORK/job.json" --summary-json "$WORK/s1b.json"
wait_chief 40
check "restart after the end: exits 0" test "$CHIEF_RC" = 0
check "restart after the end: says the job had finished" \
  grep -q "the job had finished: its last checkpoint (step 1200)" "$WORK/chief.log"
check "restart after the end: its summary has the 1200 steps" \
  test "$(json_get "$WORK/s1b.json" steps)" = 1200
# the final checkpoint holds the run's loss and evaluation: the summary of
# the chief that found the job finished reports the finished run's
check "restart after the end: the final loss of the run" \
  test "$(json_get "$WORK/s1b.json" final_loss)" = "$(json_get "$WORK/s1.json" final_loss)"
check "restart after the end: the eval loss of the run" \
  test "$(json_get "$WORK/s1b.json" eval.loss)" = "$(json_get "$WORK/s1.json" eval.loss)"
check "restart after the end: the examples of the run" \
  test "$(json_get "$WORK/s1b.json" examples)" = "$(json_get "$WORK/s1.json" examples)"
# (as one killed after writing its summary): the run's own summary, with
# the steps this chief ran, is kept
cp "$WORK/s1.json" "$WORK/s1c.json"
start_chief --job "$WORK/job.json" --summary-json "$WORK/s1c.json"
wait_chief 40
check "restart after the end over the run's summary: exits 0" test "$CHIEF_RC" = 0
check "restart after the end over the run's summary: it is kept" \
  cmp -s "$WORK/s1.json" "$WORK/s1c.json"
check "restart after the end over the run's summary: says so" \
  grep -q "is kept: it is the finished run's own" "$WORK/chief.log"
# a chief that fails (no cluster, no checkpoint of its own) never writes
# a summary of fewer steps over a finished run's
mkdir -p "$WORK/empty"
start_chief --job "$WORK/job.json" --checkpoint-dir "$WORK/empty" \
  --wait-timeout 1 --summary-json "$WORK/s1.json"
wait_chief 40
check "a failed chief: exits 1" test "$CHIEF_RC" = 1
check "a failed chief: the finished run's summary is kept" \
  test "$(json_get "$WORK/s1.json" steps)" = 1200
mv "$WORK/chief.log" "$WORK/chief1b.log.txt"

# ---- 2. one byte of the newest checkpoint flipped ------------------------------
prev=$(steps_of "$WORK/ckpt" | sed -n 2p)
newest="$WORK/ckpt/ckpt-000000001200"
victim=$(ls "$newest"/dense_1%2Fkernel.part-*.tshard | head -n 1)
/usr/bin/python3 - "$victim" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[-5] ^= 0x10            # a data byte: the file keeps its size
open(p, "wb").write(bytes(b))
PY
out=$("$TESSERA" ckpt inspect --verify "$newest" 2>&1); rc=$?
check "inspect --verify: damage found, exit 1" test "$rc" = 1
check "inspect --verify: names the file" grep -q "$(basename "$victim")" <<<"$out"
out=$("$TESSERA" ckpt inspect "$newest" 2>&1); rc=$?
check "plain inspect: damage found, exit 1" test "$rc" = 1
check "plain inspect: names the file" grep -q "$(basename "$victim")" <<<"$out"
run "$WORK/s2.json" --steps 1600
check "run 2: chief exits 0" test "$CHIEF_RC" = 0
check "run 2: skipped the damaged checkpoint, saying why" \
  grep -q "checkpoint of step 1200 skipped.*CRC32C" "$WORK/chief.log"
check "run 2: says it once" \
  test "$(grep -c "checkpoint of step 1200 skipped" "$WORK/chief.log")" = 1
check "run 2: resumed from the previous one (step $prev)" \
  test "$(json_get "$WORK/s2.json" resumed_from_step)" = "$prev"
check "run 2: exact step count" test "$(json_get "$WORK/s2.json" steps)" = 1600
mv "$WORK/chief.log" "$WORK/chief2.log.txt"

# ---- 3. a file from an older checkpoint --------------------------------------
newest="$WORK/ckpt/ckpt-000000001600"
check "run 2 committed step 1600" test -f "$newest/manifest.json"
prev=$(steps_of "$WORK/ckpt" | sed -n 2p)
older="$WORK/ckpt/ckpt-$(printf %012d "$prev")"
# the same file of the checkpoint before it, intact and of the same
# layout, goes into 1600's folder
f=$(basename "$(ls "$newest"/dense%2Fbias.part-*.tshard | head -n 1)")
cp "$older/$f" "$newest/$f"
out=$("$TESSERA" ckpt inspect "$newest" 2>&1); rc=$?
check "plain inspect: a stranger's file, exit 1" test "$rc" = 1
check "plain inspect: names it" grep -q "$f" <<<"$out"
run "$WORK/s3.json" --steps 2000
check "run 3: chief exits 0" test "$CHIEF_RC" = 0
check "run 3: skipped the checkpoint with a stranger's file" \
  grep -q "checkpoint of step 1600 skipped" "$WORK/chief.log"
check "run 3: resumed from the one before (step $prev)" \
  test "$(json_get "$WORK/s3.json" resumed_from_step)" = "$prev"
check "run 3: exact step count" test "$(json_get "$WORK/s3.json" steps)" = 2000
mv "$WORK/chief.log" "$WORK/chief3.log.txt"

# ---- 4. files the chief cannot see are never committed -----------------------
rm -rf "$WORK/ckpt"
mkdir -p "$WORK/elsewhere"
write_diabetes_job "$WORK/job4.json" ', "steps": 400, "steps_per_closure": 20,
  "checkpoint": {"dir": "ckpt", "every_steps": 200, "keep": 3}'
cluster 2 2
TF_CONFIG=$(tf_config ps 0) "$PS_BIN" --checkpoint-root "$WORK/elsewhere" \
  >>"$WORK/ps0.log" 2>&1 &
PIDS[ps0]=$!
start_ps 1
for ((i = 0; i < NWK; i++)); do start_worker $i; done
start_chief --job "$WORK/job4.json" --summary-json "$WORK/s4.json"
wait_chief 240
check "run 4: training itself completes" test "$(json_get "$WORK/s4.json" steps)" = 400
check "run 4: no checkpoint committed" test "$(ckpt_step "$WORK/ckpt")" = -1
check "run 4: a run that asked for checkpoints and committed none exits 1" \
  test "$CHIEF_RC" = 1
check "run 4: the summary says so" \
  grep -q "no checkpoint was committed" "$WORK/s4.json"
check "run 4: the chief says which file it cannot see" \
  grep -q "checkpoint of step .* failed: .*is missing (a PS on another host" "$WORK/chief.log"
finish
