#!/usr/bin/env bash
# deploy/slurm/tessera.sbatch through a real Slurm (Debian's slurm-wlm and
# munge): a one-node cluster of the test's own (slurm_node.sh) in a
# network, mount and UTS namespace of its own, started here and stopped at
# the end with nothing left running. Run by test_slurm.sh (which falls back
# to a fake srun where Slurm is missing). As an operator would, from a
# folder laid out as the repository (deploy/, tests/data, build/):
#  1. two jobs at once: `sbatch deploy/slurm/tessera.sbatch
#     deploy/jobs/diabetes.json` exactly as the README shows (no PATH: the
#     script finds build/ in the submit folder) reaches its metric, and a
#     second job (TESSERA_BIN_DIR, no checkpoint keys in its job file)
#     checkpoints by itself every TESSERA_CHECKPOINT_SECS; both COMPLETED,
#     exit 0, exact steps, ports from their job ids, tokens gone, nothing
#     left running;
#  2. kill -9 of a PS, then a worker, then the chief, inside one
#     allocation, each once a checkpoint newer than the last kill is
#     committed: exact steps, the PS restored from the newest checkpoint
#     (no rewind past it), the worker taken back, the chief resumed from
#     the newest checkpoint;
#  3. a bad job file: the job FAILED with the chief's configuration error's
#     status (ExitCode 2:0, not 137), the step cancelled, nothing started
#     again, messages under the script's own name;
#  4. scancel mid-run: the job ends, no process is left, nothing is started
#     again, the token is gone.
set -u
. "$(dirname "$0")/../cluster/lib.sh"
. "$SRC/tests/integration/deploy/slurm_node.sh"
NODE=tsrnode
if ! slurm_ns "$NODE" "$WORK"; then echo "FAIL cannot set up the namespace"; exit 1; fi
prev_cleanup() { cleanup; }
trap 'slurm_down; prev_cleanup' EXIT
t0=$SECONDS
if ! slurm_up "$WORK/slurm" "$NODE" 24; then echo "FAIL Slurm does not start"; exit 1; fi
echo "TIME slurm up $((SECONDS - t0)) s"
unset TESSERA_LOG

# a submit folder laid out as the repository: deploy/ and tests/data as
# they are, build/ the build under test
SUB=$WORK/repo
mkdir -p "$SUB/tests"
cp -r "$SRC/deploy" "$SUB/deploy"
cp -r "$SRC/tests/data" "$SUB/tests/data"
ln -s "$BUILD" "$SUB/build"
rm -rf "$SUB/deploy/token"

# submit ENV=VALUE... -- ARGS...: sbatch from the submit folder, without
# the build on PATH; prints the job id
submit() {
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  (cd "$SUB" && env -u TF_CONFIG -u TESSERA_TOKEN "${envs[@]}" sbatch --parsable "$@")
}
state() { scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
exitcode() { scontrol show job "$1" 2>/dev/null | grep -o ' ExitCode=[0-9:]*' | cut -d= -f2; }
ended() { [ -z "$(squeue -h -j "$1" -o %i 2>/dev/null)" ]; }
# waits for the job to leave the queue
wait_job() { wait_for "$2" ended "$1" || echo "job $1 still queued after $2 s: $(squeue -h -j "$1")"; }
run_of() { echo "$SUB/tessera-$1"; }
# processes of a job: every one with its token path on its command line
# (the tasks' shells too), and its Tessera programs alone
procs_of() { pgrep -f -- "$(run_of "$1")/token" | wc -l; }
programs_of() { pgrep -f -- "^tessera-(ps|worker|chief) .*$(run_of "$1")/token" | wc -l; }
stepd_of() { pgrep -f "slurmstepd: \[$1\." | wc -l; }
# the pid of the tessera process of one rank of a job (SLURM_PROCID)
rank_pid() { # JOB RANK PROGRAM
  local p
  for p in $(pgrep -x "$3"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "SLURM_JOB_ID=$1" || continue
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "SLURM_PROCID=$2" && { echo "$p"; return; }
  done
}
ckpt_of() { ckpt_step "$(run_of "$1")/checkpoints"; }
out_of() { echo "$SUB/slurm-$1.out"; }
summary() { json_get "$(run_of "$1")/summary.json" "$2" 2>/dev/null; }
lt() { /usr/bin/python3 -c "import sys; sys.exit(0 if float('$1') < float('$2') else 1)" 2>/dev/null; }
clean_end() { # JOB WHAT
  check "$2: no tessera process left" test "$(procs_of "$1")" = 0
  check "$2: no slurmstepd left" test "$(stepd_of "$1")" = 0
  check "$2: the token file is removed" test ! -e "$(run_of "$1")/token"
  check "$2: messages under the script's own name" \
    bash -c "! grep -E '/token: line|^bash: ' '$(out_of "$1")'"
}

# ---- 1. two jobs at once ------------------------------------------------------------------
/usr/bin/python3 - "$SUB/deploy/jobs/diabetes.json" "$SUB/deploy/jobs/diabetes_nockpt.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j.pop("checkpoint", None)
j.pop("epochs", None)
j["steps"] = 6000
json.dump(j, open(sys.argv[2], "w"), indent=1)
PY
t=$SECONDS
A=$(submit -- deploy/slurm/tessera.sbatch deploy/jobs/diabetes.json)
B=$(submit TESSERA_BIN_DIR="$BUILD" TESSERA_CHECKPOINT_SECS=1 -- \
    deploy/slurm/tessera.sbatch deploy/jobs/diabetes_nockpt.json)
check "two jobs submitted ($A, $B)" test -n "$A" -a -n "$B"
wait_job "$A" 240; wait_job "$B" 240
echo "TIME two jobs $((SECONDS - t)) s"
for id in $A $B; do
  base=$((20000 + 16 * (id % 2000)))
  check "job $id: COMPLETED, exit 0 ($(state "$id") $(exitcode "$id"))" \
    test "$(state "$id") $(exitcode "$id")" = "COMPLETED 0:0"
  check "job $id: the chief listened on port $base (from the job id)" \
    grep -q "chief rpc chief: listening on \[::\]:$base " "$(out_of "$id")"
  check "job $id: final checkpoint in the run folder" test "$(ckpt_of "$id")" = "$(summary "$id" steps)"
  clean_end "$id" "job $id"
done
check "job $A (README's command, no PATH): found build/ in the submit folder" \
  grep -q "programs $SUB/build/ps" "$(out_of "$A")"
check "job $A: 6000 steps (500 epochs)" test "$(summary "$A" steps)" = 6000
mse=$(summary "$A" eval.loss)
check "job $A: eval MSE ${mse:-none} < 3600 (the mean alone: 5900)" lt "${mse:-1e9}" 3600
check "job $B (TESSERA_BIN_DIR): found the build" grep -q "programs $BUILD/ps" "$(out_of "$B")"
check "job $B: exact step count" test "$(summary "$B" steps)" = 6000
n=0
for d in "$(run_of "$B")"/checkpoints/ckpt-*; do
  [ -f "$d/manifest.json" ] && [ $((10#${d##*ckpt-})) -lt 6000 ] && n=$((n + 1))
done
check "job $B: checkpoints by time with no checkpoint key in its job ($n before the final one)" \
  test "$n" -ge 1

# ---- 2. kill -9 of each role, and a bad job file alongside --------------------------------------
cat >"$SUB/bad.json" <<'JSON'
{"model": "nothing.json", "stepz": 1}
JSON
/usr/bin/python3 - "$SUB/deploy/jobs/diabetes.json" "$SUB/deploy/jobs/diabetes_kill.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j.pop("epochs", None)
j["steps"] = 16000
j["steps_per_closure"] = 20
j["checkpoint"] = {"every_steps": 500}
json.dump(j, open(sys.argv[2], "w"), indent=1)
PY
t=$SECONDS
C=$(submit -- deploy/slurm/tessera.sbatch deploy/jobs/diabetes_kill.json)
E=$(submit -- deploy/slurm/tessera.sbatch bad.json)
# kill9 WHAT RANK PROGRAM: once a checkpoint newer than the last is
# committed, kill -9 that rank's process; AT: that checkpoint
LAST=0
kill9() {
  newer() { [ "$(ckpt_of "$C")" -gt "$LAST" ]; }
  if ! wait_for 120 newer; then check "$1: a checkpoint past step $LAST" false; return; fi
  AT=$(ckpt_of "$C")
  LAST=$AT
  local p
  p=$(rank_pid "$C" "$2" "$3")
  check "$1: $3 of rank $2 runs (pid ${p:-none}) at checkpoint $AT" test -n "$p"
  [ -n "$p" ] && kill -9 "$p"
}
kill9 "ps kill" 1 tessera-ps; PS_AT=$AT
restored() { grep -q "restored the checkpoint of step" "$(out_of "$C")"; }
check "ps kill: the PS is restored" wait_for 120 restored
kill9 "worker kill" 3 tessera-worker   # rank 3: worker:0
# before the chief is killed: the chief lost worker:0 (the level says
# whether another worker was ready then) and had it ready again. The next
# checkpoint can be committed a moment after the one the worker died at
# (both waited for the PS's restore), so without this wait the chief could
# be killed before it ever saw the worker go.
back() {
  awk '/(INFO|WARN)  chief lost worker:0 /{lost = 1} lost && /INFO  chief worker:0 \(.*\) ready /{ok = 1} END {exit !ok}' "$(out_of "$C")"
}
check "worker kill: the chief lost worker:0 and took it back" wait_for 120 back
kill9 "chief kill" 0 tessera-chief; CH_AT=$AT
wait_job "$C" 300; wait_job "$E" 120
echo "TIME kills and bad job $((SECONDS - t)) s"
O=$(out_of "$C")
check "kills: COMPLETED, exit 0 ($(state "$C") $(exitcode "$C"))" \
  test "$(state "$C") $(exitcode "$C")" = "COMPLETED 0:0"
check "kills: exact step count" test "$(summary "$C" steps)" = 16000
for task in ps:0 worker:0 chief:0; do
  check "kills: $task started again in its task" \
    grep -q "tessera.sbatch: $task exited with status 137; starting it again (1 of 3)" "$O"
done
got=$(sed -n 's/.*restored the checkpoint of step \([0-9]*\).*/\1/p' "$O" | head -n 1)
check "ps kill: restored step ${got:-none}, the newest checkpoint ($PS_AT) or later" \
  test "${got:-0}" -ge "$PS_AT"
check "chief kill: resumed from step $(summary "$C" resumed_from_step), the newest checkpoint ($CH_AT) or later" \
  test "$(summary "$C" resumed_from_step)" -ge "$CH_AT"
clean_end "$C" "kills"
OE=$(out_of "$E")
check "bad job: FAILED with the chief's status 2 ($(state "$E") $(exitcode "$E"))" \
  test "$(state "$E") $(exitcode "$E")" = "FAILED 2:0"
check "bad job: the chief names the problem" grep -q 'ERROR chief .*bad.json' "$OE"
check "bad job: the step is cancelled, saying why" \
  grep -q "tessera.sbatch: the chief failed (status 2); cancelling step $E.0" "$OE"
check "bad job: nothing is started again" bash -c "! grep -q 'starting it again' '$OE'"
clean_end "$E" "bad job"

# ---- 3. scancel --------------------------------------------------------------------------------
/usr/bin/python3 - "$SUB/deploy/jobs/diabetes_kill.json" "$SUB/deploy/jobs/diabetes_long.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j["steps"] = 10000000
json.dump(j, open(sys.argv[2], "w"), indent=1)
PY
t=$SECONDS
D=$(submit -- deploy/slurm/tessera.sbatch deploy/jobs/diabetes_long.json)
going() { [ "$(ckpt_of "$D")" -gt 0 ]; }
check "scancel: the job trains (a checkpoint)" wait_for 120 going
check "scancel: every task runs ($(programs_of "$D") programs)" test "$(programs_of "$D")" = 5
scancel "$D"
wait_job "$D" 60
echo "TIME scancel $((SECONDS - t)) s"
check "scancel: CANCELLED ($(state "$D"))" test "$(state "$D")" = CANCELLED
check "scancel: nothing is started again" bash -c "! grep -q 'starting it again' '$(out_of "$D")'"
clean_end "$D" "scancel"

# ---- the cluster stops, nothing of it is left --------------------------------------------------
slurm_down
check "Slurm stopped: no munged, slurmctld, slurmd or slurmstepd of the test left" \
  test -z "$(pgrep -f "$WORK/slurm|slurmstepd" | tr '\n' ' ')"
finish
