#!/usr/bin/env bash
# Kill storms: for each mode (async, ssp:2, sync, and hybrid: dense
# "allreduce", the dense variables on the workers' ring, the PS holding no
# table of this job) a local cluster of real
# processes (1 chief, 2 PS, 2 workers, from TF_CONFIG) trains the diabetes
# job (deploy/jobs/diabetes.json) with periodic checkpoints. A normal run
# (no kill) measures the normal run time T and the exact step count, again
# before every fifth storm run (the machine's load moves); then each storm
# run kills -9 a random process or pair (any one process, any two at once:
# the chief with a worker, both workers, a PS and a worker, ...) at a random
# moment (a random time after one of the first eight checkpoints, which come
# every tenth of the run), starts what it killed again, and checks:
#  - the chief exits 0 and its summary gives the normal run's step count;
#  - the final loss is finite (the evaluation's loss when a chief restarted
#    after the final checkpoint found the job done);
#  - the newest checkpoint is readable (`tessera ckpt inspect`) and is the
#    final step's.
# A run that commits no new checkpoint for 4 T (40 checkpoint intervals of
# the normal run) is a hang: it is reported, the cluster is killed and its
# logs are kept. A hang is a run that stops moving, not a slow one: the
# machine's speed can move by more than 4x between two normal runs, and a
# run that keeps committing checkpoints ends (the steps are finite). Every failed or hung run keeps its logs
# under the folder printed at the end. A run that ended before its kill
# moment (a faster run than the normal one) is "missed": it proves nothing
# and is not a pass (a kill late in the run can miss). The table gives per mode the runs, passes, hangs,
# failures, misses, T and the passes' seconds over T (mean, max).
#
# A process the storm did not kill that exits (a crash, an exit of its own)
# gets a line in its log: `---- storm: NAME exited unkilled with status N`
# (`(signal S, ...)` when a signal ended it, then the kernel's line for a
# fault, with the instruction's address, where dmesg is readable). Each
# process runs in a folder of its own under the run's folder with core
# dumps allowed (`ulimit -c` of this script only; the machine's
# core_pattern decides where a core goes: a plain name lands in that
# folder), and a failed run keeps its cores. A run where a process the
# storm did not kill died of a signal fails, whatever else it did.
#
# Each run has its own seed (printed); it decides the victims and the
# moment, so a run is repeated with
#   storm.sh --modes MODE --seed SEED --runs 1
# Options:
#   --runs N        storm runs per mode (5)
#   --seed S        base seed (run i of a mode has seed S + i); default
#                   $TSR_STORM_SEED, else --default-seed, else a fresh one
#                   (printed)
#   --default-seed S the seed when neither of those gives one: the suite's,
#                   so that every CI run kills the same victims at the same
#                   points (the stress gate sets $TSR_STORM_SEED afresh)
#   --modes LIST    comma-separated (async,ssp:2,sync,hybrid)
#   --victims LIST  always kill these, e.g. chief+worker1 (default: random)
#   --epochs E      job epochs (default $TSR_STORM_EPOCHS, else the job's)
#   --hang-factor F a run with no new checkpoint for F T is a hang (4; T
#                   the larger of the last two normal runs), and never
#                   for less than HANG_FLOOR s (20): the chief's own waits
#                   (a chief started again after its job had finished
#                   waits up to 10 s for a cluster that may have stopped)
#                   are not hangs, however short the normal run
#   --normal-every K a normal run again before every K-th storm run, T
#                   from it (5): the machine's load moves
#   --keep DIR      keep the failed runs' logs under DIR (default
#                   $TSR_STORM_KEEP, else a fresh folder under /tmp)
# Exit status: 0 when every run passed, 1 otherwise.
# TSR_BUILD_DIR (default build/) and TSR_SOURCE_DIR (default this
# repository) as meson test sets them.
case " $* " in
  *" -h "*|*" --help "*) sed -n "2,$(grep -n '^# repository) as meson' "$0" | cut -d: -f1)p" "$0"; exit 0 ;;
esac
# run by hand from the repository: the sources here, the build in build/
TSR_SOURCE_DIR=${TSR_SOURCE_DIR:-$(cd "$(dirname "$0")/../../.." && pwd)}
TSR_BUILD_DIR=${TSR_BUILD_DIR:-$TSR_SOURCE_DIR/build}
# absolute: every process starts in a folder of its own
TSR_SOURCE_DIR=$(cd "$TSR_SOURCE_DIR" && pwd)
TSR_BUILD_DIR=$(cd "$TSR_BUILD_DIR" && pwd)
export TSR_SOURCE_DIR TSR_BUILD_DIR
. "$(dirname "$0")/../cluster/lib.sh"

RUNS=5
SEED=${TSR_STORM_SEED:-}
DEFAULT_SEED=
MODES=async,ssp:2,sync,hybrid
VICTIMS=
EPOCHS=${TSR_STORM_EPOCHS:-}
KEEP=${TSR_STORM_KEEP:-}
HANG_FACTOR=4
HANG_FLOOR=20
NORMAL_EVERY=5
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --default-seed) DEFAULT_SEED=$2; shift 2 ;;
    --modes) MODES=$2; shift 2 ;;
    --victims) VICTIMS=$2; shift 2 ;;
    --epochs) EPOCHS=$2; shift 2 ;;
    --keep) KEEP=$2; shift 2 ;;
    --hang-factor) HANG_FACTOR=$2; shift 2 ;;
    --normal-every) NORMAL_EVERY=$2; shift 2 ;;
    *) echo "storm.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for v in RUNS EPOCHS HANG_FACTOR NORMAL_EVERY; do
  if [ -n "${!v}" ] && ! [[ ${!v} =~ ^[0-9]+$ ]]; then
    echo "storm.sh: --${v,,} '${!v}' is not a whole number" >&2; exit 2
  fi
done
[ -z "$SEED" ] && SEED=$DEFAULT_SEED
[ -z "$SEED" ] && SEED=$(( $(od -An -tu2 -N2 /dev/urandom) * 1000 ))
if ! [[ $SEED =~ ^[0-9]+$ ]]; then
  echo "storm.sh: --seed '$SEED' is not a whole number" >&2; exit 2
fi

ROOT=$WORK
KEEP=${KEEP:-$(mktemp -d /tmp/tsr_storm_failed_XXXXXX)}
mkdir -p "$KEEP"
JOB=$SRC/deploy/jobs/diabetes.json
ALL=(chief ps0 ps1 worker0 worker1)
# every single process and every pair
SETS=()
for ((a = 0; a < 5; a++)); do
  SETS+=("${ALL[$a]}")
  for ((b = a + 1; b < 5; b++)); do SETS+=("${ALL[$a]}+${ALL[$b]}"); done
done

# cores, where the machine's core_pattern puts them beside the process
ulimit -c unlimited 2>/dev/null || ulimit -c "$(ulimit -Hc)" 2>/dev/null
# signame N: SIGSEGV for 11
signame() { local n; n=$(kill -l "$1" 2>/dev/null) && echo "SIG$n" || echo "$1"; }

# start NAME: starts process NAME (chief, ps0, worker1, ...) again or for
# the first time, in the folder $WORK/proc-NAME (its cores land there)
start() {
  local v=$1 here=$PWD
  mkdir -p "$WORK/proc-$v"
  cd "$WORK/proc-$v" || return
  case $v in
    chief) start_chief "${CARGS[@]}" ;;
    ps*) start_ps "${v#ps}" ;;
    worker*) start_worker "${v#worker}" ;;
  esac
  cd "$here" || return
}

# reap: every process in PIDS that exited without the storm killing it is
# noted in its log with its status, and in DIED (the ones a signal ended);
# the chief's status goes to CHIEF_RC
reap() {
  local k pid rc line core
  for k in "${!PIDS[@]}"; do
    pid=${PIDS[$k]}
    kill -0 "$pid" 2>/dev/null && continue
    wait "$pid" 2>/dev/null; rc=$?
    unset "PIDS[$k]"
    [ "$k" = chief ] && CHIEF_RC=$rc
    line="---- storm: $k exited unkilled with status $rc"
    if [ "$rc" -gt 128 ]; then
      core=$(ls -t "$WORK/proc-$k"/core* 2>/dev/null | head -n 1)
      line+=" (signal $((rc - 128)), $(signame $((rc - 128)))${core:+, core dumped: kept as $k.${core##*/} with the logs of a failed run})"
      DIED+=("$k by $(signame $((rc - 128)))")
    fi
    [ -n "${t0:-}" ] && line+=" at $(secs "$t0" "$(now)") s"
    echo "$line" >>"$WORK/$k.log"
    # the kernel's line for a fault (where the machine lets us read it):
    # the faulting address and instruction, for addr2line
    [ "$rc" -gt 128 ] && dmesg 2>/dev/null | grep -a "tessera-[a-z]*\[$pid\]: " |
      tail -n 2 | sed 's/^/---- storm: kernel: /' >>"$WORK/$k.log"
  done
}

stop_cluster() {
  local k
  reap
  for k in "${!PIDS[@]}"; do kill -9 "${PIDS[$k]}" 2>/dev/null; unset "PIDS[$k]"; done
  wait 2>/dev/null
  # the cluster is gone: its ports go back (lib.sh's cleanup, which would
  # release them, is not this script's exit trap)
  "$PORTS_BIN" release $$
}
storm_cleanup() {
  stop_cluster
  rm -rf "$ROOT"
  rmdir "$KEEP" 2>/dev/null
}
trap storm_cleanup EXIT

now() { echo "$EPOCHREALTIME"; }
now_us() { echo "${EPOCHREALTIME/./}"; }
secs() { /usr/bin/python3 -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$1" "$2"; }

# moving: true while the chief runs and its run moves: W_CK, the newest
# committed checkpoint's step, went up within the last BOUND s (W_T: when it
# last did). False once the chief has exited, or (STALLED=1) when it stood
# still for BOUND s: a hang.
moving() {
  local ck t
  reap
  [ -n "${PIDS[chief]:-}" ] || return 1
  ck=$(ckpt_step "$WORK/ckpt") t=$(now_us)
  if [ "$ck" -gt "$W_CK" ]; then W_CK=$ck W_T=$t; fi
  if [ $((t - W_T)) -ge $((BOUND * 1000000)) ]; then STALLED=1; return 1; fi
  return 0
}

# chief_args MODE: the chief's arguments for one run (the work folder WORK)
chief_args() {
  local m=(--set "mode=$1")
  [ "$1" = hybrid ] && m=(--set mode=async --set 'dense="allreduce"')
  CARGS=(--job "$JOB" ${EPOCHS:+--epochs "$EPOCHS"} "${m[@]}"
         --set steps_per_closure=20 --checkpoint-dir "$WORK/ckpt"
         --set checkpoint.every_steps=$CKPT_EVERY --set checkpoint.keep=3
         --summary-json "$WORK/summary.json")
}

# verify EXPECTED_STEPS: checks the run in WORK; sets WHY on failure
verify() {
  local steps loss ck
  WHY=
  if [ "$CHIEF_RC" != 0 ]; then WHY="chief exit $CHIEF_RC: $(grep ' ERROR ' "$WORK/chief.log" | tail -n 1)"; return 1; fi
  steps=$(json_get "$WORK/summary.json" steps 2>/dev/null)
  if [ -n "$1" ] && [ "$steps" != "$1" ]; then WHY="steps $steps, expected $1"; return 1; fi
  loss=$(json_get "$WORK/summary.json" final_loss 2>/dev/null)
  # a chief killed after the final checkpoint finds the job done and trains
  # nothing: no training loss, its evaluation's instead
  if [ "$loss" = None ] && [ "$(json_get "$WORK/summary.json" steps_run 2>/dev/null)" = 0 ]; then
    loss=$(json_get "$WORK/summary.json" eval.loss 2>/dev/null)
  fi
  if ! /usr/bin/python3 -c 'import math,sys; sys.exit(0 if math.isfinite(float(sys.argv[1])) else 1)' "$loss" 2>/dev/null; then
    WHY="final loss '$loss' is not finite"; return 1
  fi
  if ! "$TESSERA" ckpt inspect "$WORK/ckpt" >"$WORK/inspect.txt" 2>&1; then
    WHY="newest checkpoint unreadable: $(tail -n 1 "$WORK/inspect.txt")"; return 1
  fi
  ck=$(ckpt_step "$WORK/ckpt")
  if [ "$ck" != "$steps" ]; then WHY="newest checkpoint is step $ck, not the final $steps"; return 1; fi
  STEPS_DONE=$steps
  LOSS=$loss
}

# one_run MODE NAME: a fresh cluster in $ROOT/NAME; the kill (if KILL_AT is
# set: once the checkpoint of step KILL_AT is committed, KILL_DELAY s later,
# of the processes in VICT); a run whose newest checkpoint stays the same
# for BOUND s is stopped as a hang. Sets OUTCOME (pass, hang, fail),
# ELAPSED, WHY.
one_run() {
  local mode=$1 t0 v killed=0
  WORK=$ROOT/$2
  mkdir -p "$WORK"
  cluster 2 2
  chief_args "$mode"
  t0=$(now)
  DIED=() CHIEF_RC=
  for v in ps0 ps1 worker0 worker1 chief; do start "$v"; done
  W_CK=-1 W_T=$(now_us) STALLED=0
  if [ -n "${KILL_AT:-}" ]; then
    # the moment is one of progress, not of time (this machine's speed
    # moves): after a checkpoint, some way to the next one
    while moving && [ "$W_CK" -lt 0 ]; do sleep 0.05; done
    t_ck0=$(now)
    while moving && [ "$W_CK" -lt "$KILL_AT" ]; do sleep 0.05; done
  fi
  # a run that stood still before its kill moment is a hang: no kill
  if [ -n "${KILL_AT:-}" ] && [ "$STALLED" = 0 ]; then
    # a part (KILL_FRAC %) of the time between two checkpoints, as this
    # run goes (after step 0: a tenth of the fastest normal run)
    KILL_DELAY=$(/usr/bin/python3 -c "import sys; k=int(sys.argv[1]); t=float(sys.argv[2]) - float(sys.argv[3]); iv=t / k if k else float(sys.argv[4]) / 10; print('%.2f' % (iv * int(sys.argv[5]) / 100))" \
      "$((KILL_AT / CKPT_EVERY))" "$(now)" "$t_ck0" "$TMIN" "$KILL_FRAC")
    sleep "$KILL_DELAY"
    KILLED_AT=$(secs "$t0" "$(now)")
    reap
    if [ -z "${PIDS[chief]:-}" ]; then
      NOTE="the run ended before the kill"
    else
      IFS=+ read -r -a vs <<<"$VICT"
      # a victim reap found gone (a PS or worker that the chief's end of
      # the job let exit, say) has no pid left to kill: it is only
      # started again, as a killed one is
      for v in "${vs[@]}"; do
        [ -n "${PIDS[$v]:-}" ] && kill -9 "${PIDS[$v]}" 2>/dev/null
      done
      for v in "${vs[@]}"; do
        if [ -n "${PIDS[$v]:-}" ]; then
          wait "${PIDS[$v]}" 2>/dev/null
          echo "---- storm: killed $v (-9) at $(secs "$t0" "$(now)") s, started again" >>"$WORK/$v.log"
        else
          echo "---- storm: $v had exited before its kill at $(secs "$t0" "$(now)") s, started again" >>"$WORK/$v.log"
        fi
        start "$v"
      done
      killed=1
    fi
  fi
  while moving; do sleep 0.1; done
  ELAPSED=$(secs "$t0" "$(now)")
  if [ "$STALLED" = 1 ]; then
    OUTCOME=hang
    WHY="no new checkpoint for $BOUND s (newest: step $W_CK), last progress line: $(grep -ao 'step [0-9]*/[0-9]*' "$WORK/chief.log" | tail -n 1)"
    stop_cluster
    [ ${#DIED[@]} -gt 0 ] && WHY+="; died unkilled: ${DIED[*]}"
    return
  fi
  stop_cluster
  if [ ${#DIED[@]} -gt 0 ]; then
    OUTCOME=fail WHY="died unkilled: ${DIED[*]} (see the ---- storm: lines)"
  elif ! verify "${EXPECT:-}"; then OUTCOME=fail
  elif [ -n "${KILL_AT:-}" ] && [ $killed = 0 ]; then OUTCOME=missed
  else OUTCOME=pass; fi
}

keep_logs() { # name
  mkdir -p "$KEEP/$1"
  cp "$WORK"/*.log "$WORK"/summary.json "$WORK"/inspect.txt "$KEEP/$1/" 2>/dev/null
  local c
  for c in "$WORK"/proc-*/core*; do
    [ -f "$c" ] || continue
    c=${c#"$WORK"/proc-}
    cp "$WORK/proc-$c" "$KEEP/$1/${c%%/*}.${c##*/}"
  done
  ls "$WORK/ckpt" >"$KEEP/$1/ckpt_folders.txt" 2>/dev/null
}

echo "storm: seed $SEED, $RUNS runs per mode, modes $MODES, $JOB${EPOCHS:+ with $EPOCHS epochs}"
echo "storm: repeat one run with: $0 --modes MODE --seed SEED --runs 1${EPOCHS:+ --epochs $EPOCHS}"
IFS=, read -r -a mode_list <<<"$MODES"
TABLE=()
declare -A BY_RUNS BY_PASS BY_MISS
KINDS=("a worker" "a PS" "the chief" "chief+worker" "both workers" "PS+worker" "both PS" "chief+PS")
# kind SET: the failure a set of victims is (chief+worker1 is chief+worker)
kind() {
  case $1 in
    worker?) echo "a worker" ;;
    ps?) echo "a PS" ;;
    chief) echo "the chief" ;;
    chief+worker?) echo "chief+worker" ;;
    worker0+worker1) echo "both workers" ;;
    ps?+worker?) echo "PS+worker" ;;
    ps0+ps1) echo "both PS" ;;
    chief+ps?) echo "chief+PS" ;;
    *) echo "$1" ;;
  esac
}
# normal_run MODE TAG K: the K-th run without a kill; sets T (its seconds),
# EXPECT (its steps; later ones must give the same), BOUND (HANG_FACTOR
# times the larger of the last two T, at least HANG_FLOOR) and CKPT_EVERY (a tenth of the run)
normal_run() {
  local t_prev=$T
  KILL_AT= ; NOTE= ; BOUND=600
  one_run "$1" "$2-normal$3"
  if [ "$OUTCOME" != pass ]; then
    echo "storm: $1 normal run $3: $OUTCOME ($WHY)"
    keep_logs "$2-normal$3"
    ANY_BAD=1
    rm -rf "$WORK"
    return 1
  fi
  T=$ELAPSED
  TMIN=$(/usr/bin/python3 -c "import sys; print(min(float(x) for x in sys.argv[1:] if x))" "$T" "${TMIN:-}")
  EXPECT=$STEPS_DONE
  CKPT_EVERY=$(( EXPECT / 10 > 20 ? EXPECT / 10 : 20 ))
  BOUND=$(/usr/bin/python3 -c "import math,sys; print(max(int(sys.argv[2]), math.ceil(int(sys.argv[1]) * max(float(x) for x in sys.argv[3:] if x))))" "$HANG_FACTOR" "$HANG_FLOOR" "$T" "$t_prev")
  echo "storm: $1 normal run $3: $EXPECT steps in $T s (loss $LOSS); a hang: no new checkpoint for $BOUND s"
  rm -rf "$WORK"
}
ANY_BAD=0
for mode in "${mode_list[@]}"; do
  case $mode in async|sync|hybrid|ssp:[0-9]*) ;; *) echo "storm.sh: unknown mode '$mode'" >&2; exit 2 ;; esac
  tag=${mode/:/}
  # ---- the normal run: T and the step count ----
  CKPT_EVERY=200 EXPECT= T= TMIN=
  passes=0 hangs=0 fails=0 missed=0 overs=()
  if ! normal_run "$mode" "$tag" 1; then
    TABLE+=("$(printf '%-7s %5s %6s %6s %6s %6s %9s %9s %9s' "$mode" 0 0 0 1 0 - - -)")
    continue
  fi
  for ((i = 0; i < RUNS; i++)); do
    # T again every NORMAL_EVERY runs: the machine's load moves
    if [ "$i" -gt 0 ] && [ $((i % NORMAL_EVERY)) = 0 ]; then
      normal_run "$mode" "$tag" $((i / NORMAL_EVERY + 1)) || fails=$((fails + 1))
    fi
    s=$((SEED + i))
    # the run's seed picks one of the 15 sets and a moment: after the
    # checkpoint of step k * CKPT_EVERY (k in 0..7), a random part of the
    # time between two checkpoints later
    read -r pick k frac < <(/usr/bin/python3 -c "import random,sys; r=random.Random(int(sys.argv[1])); print(r.randrange(int(sys.argv[2])), r.randrange(8), r.randrange(100))" "$s" "${#SETS[@]}")
    if [ -n "$VICTIMS" ]; then VICT=$VICTIMS; else VICT=${SETS[$pick]}; fi
    KILL_AT=$((k * CKPT_EVERY)) KILL_FRAC=$frac KILL_DELAY=- KILLED_AT=-
    NOTE=
    one_run "$mode" "$tag-$s"
    over=$(/usr/bin/python3 -c "import sys; print('%.1f' % (float(sys.argv[1]) - float(sys.argv[2])))" "$ELAPSED" "$T")
    line="storm: $mode run $((i + 1))/$RUNS seed $s: kill -9 $VICT $KILL_DELAY s after the checkpoint of step $KILL_AT ($KILLED_AT s into the run): $OUTCOME in $ELAPSED s ($over s over T)"
    [ -n "$NOTE" ] && line+=" [$NOTE]"
    case $OUTCOME in
      pass) passes=$((passes + 1)); overs+=("$over") ;;
      missed) missed=$((missed + 1)) ;;
      hang) hangs=$((hangs + 1)); line+=": $WHY" ;;
      fail) fails=$((fails + 1)); line+=": $WHY" ;;
    esac
    echo "$line"
    k="$mode|$(kind "$VICT")"
    BY_RUNS[$k]=$(( ${BY_RUNS[$k]:-0} + 1 ))
    [ "$OUTCOME" = pass ] && BY_PASS[$k]=$(( ${BY_PASS[$k]:-0} + 1 ))
    [ "$OUTCOME" = missed ] && BY_MISS[$k]=$(( ${BY_MISS[$k]:-0} + 1 ))
    if [ "$OUTCOME" = hang ] || [ "$OUTCOME" = fail ]; then
      keep_logs "$tag-$s"
      echo "$line" >"$KEEP/$tag-$s/what.txt"
      echo "storm:   logs in $KEEP/$tag-$s"
      ANY_BAD=1
    fi
    rm -rf "$WORK"
  done
  stats=$(/usr/bin/python3 -c "import sys; v=[float(x) for x in sys.argv[1:]]; print('%.1f %.1f' % (sum(v)/len(v), max(v)) if v else '- -')" "${overs[@]}")
  TABLE+=("$(printf '%-7s %5d %6d %6d %6d %6d %9s %9s %9s' "$mode" "$RUNS" "$passes" "$hangs" "$fails" "$missed" "$T" ${stats})")
done

echo
printf '%-7s %5s %6s %6s %6s %6s %9s %9s %9s\n' mode runs passes hangs failed missed normal_s over_mean over_max
for row in "${TABLE[@]}"; do echo "$row"; done
echo
echo "passes/runs by failure (a miss is not counted)"
hdr=$(printf '%-14s' failure)
for mode in "${mode_list[@]}"; do hdr+=$(printf ' %8s' "$mode"); done
echo "$hdr"
for kd in "${KINDS[@]}"; do
  row=$(printf '%-14s' "$kd")
  for mode in "${mode_list[@]}"; do
    k="$mode|$kd"
    n=$(( ${BY_RUNS[$k]:-0} - ${BY_MISS[$k]:-0} ))
    row+=$(printf ' %8s' "${BY_PASS[$k]:-0}/$n")
  done
  echo "$row"
done
echo "seed $SEED"
if [ "$ANY_BAD" != 0 ]; then echo "logs of the failed runs kept in $KEEP"; exit 1; fi
exit 0
