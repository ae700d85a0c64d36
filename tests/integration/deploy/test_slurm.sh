#!/usr/bin/env bash
# deploy/slurm/tessera.sbatch under Slurm. Where Slurm is installed
# (`deploy/setup.sh test` installs slurm-wlm and munge) and this runs as
# root, through a real one-node Slurm of the test's own:
# test_slurm_real.sh. Elsewhere (or with TSR_SLURM_FAKE=1), as sbatch would
# run it, with a fake srun and scancel (fake_slurm/) that start the step's
# tasks on this machine:
#  1. two jobs at once on the same "node": ports from the job ids do not
#     collide; both train to the exact step count with checkpoints in their
#     run folders; srun got --cpus-per-task and --kill-on-bad-exit; the
#     token files are gone afterwards;
#  2. a PS killed with -9 mid-run is started again in its task and the chief
#     restores the shared checkpoint: exact step count;
#  3. a chief that fails (a bad job file) cancels the step: the script ends
#     with an error instead of waiting for the time limit, no PS or worker
#     is left, the token is removed.
here=$(dirname "$0")
if [ -z "${TSR_SLURM_FAKE:-}" ] && [ "$(id -u)" = 0 ] &&
   command -v sbatch >/dev/null && command -v slurmctld >/dev/null &&
   command -v slurmd >/dev/null && command -v munged >/dev/null &&
   unshare -n -m -u true 2>/dev/null; then
  echo "real Slurm: slurm-wlm $(dpkg-query -W -f='${Version}' slurm-wlm 2>/dev/null)"
  exec unshare -n -m -u bash "$here/test_slurm_real.sh"
fi
echo "no Slurm here (or not root, or TSR_SLURM_FAKE set): a fake srun and scancel"
. "$here/../cluster/lib.sh"
FAKE=$SRC/tests/integration/deploy/fake_slurm
SB=$SRC/deploy/slurm/tessera.sbatch
export FAKE_SLURM_DIR=$WORK/slurm
mkdir -p "$FAKE_SLURM_DIR"
STEPS=6000

# sbatch_run ID LOG JOB [ENV=VALUE...]: runs the script as sbatch would, in
# the background; SB_PID
sbatch_run() {
  local id=$1 log=$2 job=$3; shift 3
  mkdir -p "$WORK/submit$id"
  (cd "$WORK/submit$id" && exec env -u TF_CONFIG -u TESSERA_TOKEN \
    PATH="$FAKE:$PATH" TESSERA_BIN_DIR="$BUILD" \
    SLURM_JOB_ID="$id" SLURM_SUBMIT_DIR="$WORK/submit$id" SLURM_NTASKS=5 \
    SLURM_JOB_NODELIST=localhost SLURM_TASKS_PER_NODE=5 SLURM_CPUS_PER_TASK=2 \
    TESSERA_LOG=info "$@" bash "$SB" "$job" >"$log" 2>&1) &
  SB_PID=$!
}
sb_wait() { # PID SECONDS: waits; SB_RC
  local deadline=$((SECONDS + $2))
  while kill -0 "$1" 2>/dev/null; do
    if [ $SECONDS -ge $deadline ]; then echo "sbatch still running after $2 s"; SB_RC=124; return; fi
    sleep 0.2
  done
  wait "$1"; SB_RC=$?
}
# the step's tessera processes still alive
step_procs() { # JOBID
  local g c n=0
  for g in $(awk '{print $2}' "$FAKE_SLURM_DIR/step-$1.0" 2>/dev/null); do
    c=$(pgrep -g "$g" -c -f 'tessera-(ps|worker|chief)' 2>/dev/null)
    n=$((n + ${c:-0}))
  done
  echo "$n"
}
ckpt_of() { ckpt_step "$WORK/submit$1/tessera-$1/checkpoints"; }
kill_steps() { # every task this test's fake srun started
  local f g
  for f in "$FAKE_SLURM_DIR"/step-*; do
    [ -f "$f" ] && for g in $(awk '{print $2}' "$f"); do kill -9 -- "-$g" 2>/dev/null; done
  done
}
trap 'kill_steps; cleanup' EXIT
# job_id: a job id whose 16 ports (the script's rule: 20000 + 16 * (id mod
# 2000) on) are claimed for this test (tests/ports/ports.h), so another
# test's process cannot hold one, nor take it while a task is started
# again
job_id() {
  local run
  run=$("$PORTS_BIN" claim-run 16 $$) || return 1
  echo $((4000 + (${run%% *} - 20000) / 16))
}

write_diabetes_job "$WORK/job.json" ", \"steps\": $STEPS, \"steps_per_closure\": 20,
  \"checkpoint\": {\"every_steps\": 1000}"

# ---- 1. two jobs on one node -------------------------------------------------------
A=$(job_id) || exit 1
B=$(job_id) || exit 1
sbatch_run $A "$WORK/sbatch$A.log" "$WORK/job.json"; PA=$SB_PID
sbatch_run $B "$WORK/sbatch$B.log" "$WORK/job.json"; PB=$SB_PID
sb_wait $PA 300; RA=$SB_RC
sb_wait $PB 300; RB=$SB_RC
for id in $A $B; do
  rc=$RA; [ $id = $B ] && rc=$RB
  R=$WORK/submit$id/tessera-$id
  base=$((20000 + 16 * (id % 2000)))
  check "job $id: sbatch script exits 0 ($rc)" test "$rc" = 0
  check "job $id: exact step count" test "$(json_get "$R/summary.json" steps 2>/dev/null)" = $STEPS
  check "job $id: final checkpoint in the run folder" test "$(ckpt_of $id)" = $STEPS
  check "job $id: the chief listened on port $base (from the job id)" \
    grep -q "listening on 127.0.0.1:$base " "$WORK/sbatch$id.log"
  check "job $id: srun got --cpus-per-task=2 and --kill-on-bad-exit=0" \
    bash -c "grep -qx -- --cpus-per-task=2 '$FAKE_SLURM_DIR/srun-$id.args' &&
             grep -qx -- --kill-on-bad-exit=0 '$FAKE_SLURM_DIR/srun-$id.args'"
  check "job $id: the token file is removed" test ! -e "$R/token"
  check "job $id: no process left" test "$(step_procs $id)" = 0
done

# ---- 2. a PS killed mid-run -------------------------------------------------------------
C=$(job_id) || exit 1
sbatch_run $C "$WORK/sbatch$C.log" "$WORK/job.json"; PC=$SB_PID
past() { [ "$(ckpt_of $C)" -gt 0 ]; }
check "ps kill: a checkpoint past step 0" wait_for 120 past
g=$(awk '$1 == 1 {print $2}' "$FAKE_SLURM_DIR/step-$C.0")   # rank 1 is ps:0
victim=$(pgrep -g "$g" -x tessera-ps | head -n 1)
check "ps kill: ps:0 is running (pid ${victim:-none})" test -n "$victim"
[ -n "$victim" ] && kill -9 "$victim"
sb_wait $PC 300
R=$WORK/submit$C/tessera-$C
check "ps kill: sbatch script exits 0 ($SB_RC)" test "$SB_RC" = 0
check "ps kill: the task started ps:0 again" grep -q "ps:0 exited with status 137; starting it again" "$WORK/sbatch$C.log"
check "ps kill: restored from the shared checkpoint" grep -q "restored the checkpoint of step" "$WORK/sbatch$C.log"
check "ps kill: exact step count" test "$(json_get "$R/summary.json" steps 2>/dev/null)" = $STEPS
check "ps kill: the token file is removed" test ! -e "$R/token"

# ---- 3. the chief fails ---------------------------------------------------------------------
D=$(job_id) || exit 1
echo '{"model": "nothing.json", "stepz": 1}' >"$WORK/bad.json"
sbatch_run $D "$WORK/sbatch$D.log" "$WORK/bad.json"; PD=$SB_PID
sb_wait $PD 120
check "chief fails: the sbatch script fails with the chief's status, 2 ($SB_RC)" test "$SB_RC" = 2
check "chief fails: the step is cancelled" grep -qx "$D.0" "$FAKE_SLURM_DIR/scancel.log"
check "chief fails: it says why" grep -q "the chief failed (status 2); cancelling step $D.0" "$WORK/sbatch$D.log"
check "chief fails: nothing is started again" bash -c "! grep -q 'starting it again' '$WORK/sbatch$D.log'"
check "chief fails: no PS or worker left" test "$(step_procs $D)" = 0
check "chief fails: the token file is removed" test ! -e "$WORK/submit$D/tessera-$D/token"
finish
