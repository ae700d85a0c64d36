#!/usr/bin/env bash
# Helpers for the cluster integration tests: a real cluster of tessera-ps,
# tessera-worker and tessera-chief processes on 127.0.0.1 with ports claimed
# for the test (free_ports), each started from TF_CONFIG exactly as a
# Kubeflow TFJob sets it (the whole cluster, and this task's type and
# index). Every wait has a deadline; every process is killed on exit.
set -u
BUILD=${TSR_BUILD_DIR:?TSR_BUILD_DIR not set}
SRC=${TSR_SOURCE_DIR:?TSR_SOURCE_DIR not set}
PS_BIN=$BUILD/ps/tessera-ps
WK_BIN=$BUILD/worker/tessera-worker
CH_BIN=$BUILD/chief/tessera-chief
TESSERA=$BUILD/chief/tessera
PORTS_BIN=$BUILD/tests/ports/tsr-test-ports
WORK=$(mktemp -d /tmp/tsr_cluster_XXXXXX)
export TESSERA_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
export TESSERA_LOG=${TESSERA_LOG_LEVEL:-info}
declare -A PIDS
FAILS=0
PASSES=0

cleanup() {
  for k in "${!PIDS[@]}"; do kill -9 "${PIDS[$k]}" 2>/dev/null; done
  # a process whose PIDS entry a later start replaced (a check that failed
  # left it running) is still this shell's child: kill it too, or the wait
  # below waits for it until the suite's timeout
  local j
  for j in $(jobs -p); do kill -9 "$j" 2>/dev/null; done
  wait 2>/dev/null
  # every process of this test is gone: its ports may go to others now
  "$PORTS_BIN" release $$
  if [ "$FAILS" != 0 ] || [ -n "${KEEP_WORK:-}" ]; then
    echo "logs kept in $WORK"
    for f in "$WORK"/*.log; do echo "---- $f"; tail -n 25 "$f"; done
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT

# free_ports N: N distinct ports claimed for this test until its cleanup
# (tests/ports/ports.h): from a block below the kernel's ephemeral range,
# and handed to no other test while this one lives, even while the process
# of this test that had one is down (a PS killed and started again on its
# port). On failure, a line on stderr and status 1.
free_ports() { "$PORTS_BIN" claim "$1" $$; }

# cluster NPS NWK [evaluator]: sets CLUSTER (the TF_CONFIG cluster JSON)
cluster() {
  local nps=$1 nwk=$2 got
  if ! got=$(free_ports $((2 + nps + nwk))); then
    FAILS=$((FAILS + 1)); echo "FAIL cannot claim ports for the cluster"; exit 1
  fi
  read -r -a P <<<"$got"
  local ps="" wk="" ev="" i
  for ((i = 0; i < nps; i++)); do ps+="${ps:+,}\"127.0.0.1:${P[$((1 + i))]}\""; done
  for ((i = 0; i < nwk; i++)); do wk+="${wk:+,}\"127.0.0.1:${P[$((1 + nps + i))]}\""; done
  [ "${3:-}" = evaluator ] && ev=",\"evaluator\":[\"127.0.0.1:${P[$((1 + nps + nwk))]}\"]"
  CLUSTER="{\"chief\":[\"127.0.0.1:${P[0]}\"],\"ps\":[$ps],\"worker\":[$wk]$ev}"
  NPS=$nps
  NWK=$nwk
}

tf_config() { # type index
  echo "{\"cluster\":$CLUSTER,\"task\":{\"type\":\"$1\",\"index\":$2}}"
}

start_ps() { # index
  TF_CONFIG=$(tf_config ps "$1") "$PS_BIN" >>"$WORK/ps$1.log" 2>&1 &
  PIDS[ps$1]=$!
}

start_worker() { # index
  TF_CONFIG=$(tf_config worker "$1") "$WK_BIN" --device cpu >>"$WORK/worker$1.log" 2>&1 &
  PIDS[worker$1]=$!
}

# start_chief ARGS...: in the background; CHIEF_PID
start_chief() {
  TF_CONFIG=$(tf_config chief 0) "$CH_BIN" --wait-timeout 60 \
    --ps-timeout 60 "$@" >>"$WORK/chief.log" 2>&1 &
  PIDS[chief]=$!
  CHIEF_PID=$!
}

# start_evaluator ARGS...: the evaluator task (tessera-chief as evaluator)
start_evaluator() {
  TF_CONFIG=$(tf_config evaluator 0) "$CH_BIN" --eval-poll 0.2 \
    --eval-idle-timeout 60 "$@" >>"$WORK/evaluator.log" 2>&1 &
  PIDS[evaluator]=$!
}

start_all() {
  local i
  for ((i = 0; i < NPS; i++)); do start_ps $i; done
  for ((i = 0; i < NWK; i++)); do start_worker $i; done
}

# wait_chief SECONDS: waits for the chief; CHIEF_RC
wait_chief() {
  local deadline=$((SECONDS + $1))
  while kill -0 "$CHIEF_PID" 2>/dev/null; do
    if [ $SECONDS -ge $deadline ]; then
      echo "chief still running after $1 s"; kill -9 "$CHIEF_PID"; CHIEF_RC=124; return
    fi
    sleep 0.2
  done
  wait "$CHIEF_PID"; CHIEF_RC=$?
  unset 'PIDS[chief]'
}

# wait_for SECONDS COMMAND...: polls until COMMAND succeeds
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do
    [ $SECONDS -ge $deadline ] && return 1
    sleep 0.1
  done
}

# newest committed checkpoint step in DIR (or -1)
ckpt_step() {
  local d best=-1 s
  for d in "$1"/ckpt-*; do
    [ -f "$d/manifest.json" ] || continue
    s=$((10#${d##*ckpt-}))
    [ "$s" -gt "$best" ] && best=$s
  done
  echo "$best"
}

json_get() { # file key  (top-level number or string)
  /usr/bin/python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); k=sys.argv[2].split("."); 
for p in k: v=v[p]
print(v)' "$1" "$2"
}

check() { # description, command...
  local what=$1; shift
  if "$@"; then PASSES=$((PASSES + 1)); echo "ok   $what"
  else FAILS=$((FAILS + 1)); echo "FAIL $what"; fi
}

finish() {
  echo "$PASSES passed, $FAILS failed"
  [ "$FAILS" = 0 ]
}

# The Keras example model on the diabetes set (named layers, as
# model.to_json() writes them), with the split of tests/data/README.md.
write_diabetes_job() { # path, extra JSON members (e.g. ', "steps": 100')
  cp "$SRC/tests/data/diabetes.csv" "$WORK/diabetes.csv"
  cat >"$1" <<JSON
{
  "model": {"class_name": "Sequential", "config": {"name": "sequential", "layers": [
    {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 10], "name": "input_1"}},
    {"class_name": "Dense", "config": {"name": "dense", "units": 64, "activation": "relu"}},
    {"class_name": "Dense", "config": {"name": "dense_1", "units": 1}}]}},
  "loss": "mse",
  "optimizer": {"name": "adam", "learning_rate": 0.001},
  "batch_size": 32,
  "seed": 1,
  "data": {
    "train": {"format": "csv", "paths": "diabetes.csv", "label": "target",
              "features": "all but label", "normalize": true,
              "shuffle_buffer": 1000},
    "eval": {"split": "every", "k": 5, "index": 4}
  }$2
}
JSON
}
