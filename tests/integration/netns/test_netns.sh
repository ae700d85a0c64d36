#!/usr/bin/env bash
# Multi-host tests: each process on its own "host" (a network namespace
# with its own address, see netns.sh), the cluster started from TF_CONFIG.
#   1. a full training run across 5 hosts (chief, 2 PS, 2 workers)
#   2. a worker cut off for longer than the heartbeat timeout, then
#      restored: the run completes with the exact step count
#   3. a PS cut off: the chief recovers from the last checkpoint
#   4. a worker on a slow link under ssp:2: no read is let through more
#      than 2 clocks ahead of the slowest (the PS's own account, via tessera
#      status), and the run ends (a worker done with its share leaves)
#   5. a process on a host outside the cluster with the wrong token is
#      refused, and the PS logs its address
. "$(dirname "$0")/../cluster/lib.sh"
. "$(dirname "$0")/netns.sh"

if [ "$(id -u)" != 0 ]; then
  echo "network namespaces need root"; FAILS=1; finish; exit 1
fi
trap 'net_down; cleanup' EXIT

net_up 6 || { echo "could not create the namespaces"; FAILS=1; exit 1; }
# host 1 chief, 2-3 ps, 4-5 workers, 6 outside the cluster
PORT=2222
CLUSTER="{\"chief\":[\"${HOST_IP[1]}:$PORT\"],\"ps\":[\"${HOST_IP[2]}:$PORT\",\"${HOST_IP[3]}:$PORT\"],\"worker\":[\"${HOST_IP[4]}:$PORT\",\"${HOST_IP[5]}:$PORT\"]}"
NPS=2
NWK=2
host_of() { case $1 in chief) echo 1;; ps) echo $((2 + $2));; worker) echo $((4 + $2));; esac; }

start_ps() {
  on "$(host_of ps "$1")" env TF_CONFIG="$(tf_config ps "$1")" "$PS_BIN" \
    >>"$WORK/ps$1.log" 2>&1 &
  PIDS[ps$1]=$!
}
start_worker() {
  on "$(host_of worker "$1")" env TF_CONFIG="$(tf_config worker "$1")" \
    "$WK_BIN" --device cpu >>"$WORK/worker$1.log" 2>&1 &
  PIDS[worker$1]=$!
}
start_chief() {
  on 1 env TF_CONFIG="$(tf_config chief 0)" "$CH_BIN" --wait-timeout 60 \
    --ps-timeout 60 --heartbeat-timeout 2 "$@" >>"$WORK/chief.log" 2>&1 &
  PIDS[chief]=$!
  CHIEF_PID=$!
}
stop_all() {
  for k in "${!PIDS[@]}"; do kill -9 "${PIDS[$k]}" 2>/dev/null; unset "PIDS[$k]"; done
  host_kill
  wait 2>/dev/null
}
started() { grep -q "ready on" "$WORK/chief.log" 2>/dev/null; }
past_ckpt() { [ "$(ckpt_step "$WORK/ckpt")" -gt 0 ]; }

# ---- 1. a run across 5 hosts -------------------------------------------
write_diabetes_job "$WORK/job.json" ', "steps": 3000, "steps_per_closure": 20'
start_all
start_chief --job "$WORK/job.json" --summary-json "$WORK/s1.json"
wait_chief 180
check "5 hosts: chief exits 0" test "$CHIEF_RC" = 0
check "5 hosts: exact step count" test "$(json_get "$WORK/s1.json" steps 2>/dev/null)" = 3000
check "5 hosts: workers on their own addresses" grep -q "worker:1 (10.231.0.5:$PORT) ready" "$WORK/chief.log"
stop_all
mv "$WORK/chief.log" "$WORK/chief1.log.txt"

# ---- 2. a worker cut off, then restored -----------------------------------
STEPS=40000
write_diabetes_job "$WORK/job.json" ", \"steps\": $STEPS, \"steps_per_closure\": 20"
start_all
start_chief --job "$WORK/job.json" --summary-json "$WORK/s2.json"
check "worker cut: training started" wait_for 60 started
sleep 1
cut "$(host_of worker 1)"
lost() { grep -q "lost worker:1" "$WORK/chief.log"; }
check "worker cut: the chief notices within the heartbeat timeout" wait_for 10 lost
sleep 3
restore "$(host_of worker 1)"
back() { grep -q "worker:1 .* is back" "$WORK/chief.log"; }
check "worker cut: the worker comes back" wait_for 30 back
wait_chief 240
check "worker cut: chief exits 0" test "$CHIEF_RC" = 0
check "worker cut: exact step count" test "$(json_get "$WORK/s2.json" steps 2>/dev/null)" = $STEPS
stop_all
mv "$WORK/chief.log" "$WORK/chief2.log.txt"

# ---- 3. a PS cut off ---------------------------------------------------------
write_diabetes_job "$WORK/job.json" ", \"steps\": $STEPS, \"steps_per_closure\": 20,
  \"checkpoint\": {\"dir\": \"ckpt\", \"every_steps\": 4000}"
start_all
start_chief --job "$WORK/job.json" --summary-json "$WORK/s3.json"
check "ps cut: a checkpoint past step 0" wait_for 90 past_ckpt
cut "$(host_of ps 1)"
lostps() { grep -q "lost ps:1" "$WORK/chief.log"; }
check "ps cut: the chief notices" wait_for 10 lostps
sleep 2
restore "$(host_of ps 1)"
wait_chief 240
check "ps cut: chief exits 0" test "$CHIEF_RC" = 0
check "ps cut: exact step count" test "$(json_get "$WORK/s3.json" steps 2>/dev/null)" = $STEPS
check "ps cut: recovered from a checkpoint" grep -q "restored the checkpoint of step" "$WORK/chief.log"
stop_all
mv "$WORK/chief.log" "$WORK/chief3.log.txt"
rm -rf "$WORK/ckpt"

# ---- 4. a slow worker under ssp:2 ---------------------------------------------
# every byte between worker 1 and the parameter servers goes through a
# proxy in its host that delays it by 5 ms each way (a slow link)
write_diabetes_job "$WORK/job.json" ', "steps": 400, "steps_per_closure": 10,
  "mode": "ssp:2"'
slow_link "$(host_of worker 1)" "${HOST_IP[2]}" $PORT 5
slow_link "$(host_of worker 1)" "${HOST_IP[3]}" $PORT 5
start_all
start_chief --job "$WORK/job.json" --summary-json "$WORK/s4.json" --keep-cluster
wait_chief 240
check "ssp:2: chief exits 0" test "$CHIEF_RC" = 0
st=$(on 1 env TF_CONFIG="{\"cluster\":$CLUSTER}" "$TESSERA" status 2>&1)
echo "$st"
leads=$(sed -n 's/.*max read lead \([0-9-]*\).*/\1/p' <<<"$st" | sort -n | tail -1)
check "ssp:2: reads never more than 2 clocks ahead (max lead ${leads:-?})" test "${leads:-99}" -le 2
check "ssp:2: the bound was reached (the fast worker was held)" test "${leads:--1}" -ge 1
w0=$(sed -n 's/^worker:0 .* [a-z]* *\([0-9]*\) steps.*/\1/p' <<<"$st" | head -1)
w1=$(sed -n 's/^worker:1 .* [a-z]* *\([0-9]*\) steps.*/\1/p' <<<"$st" | head -1)
echo "steps: fast worker $w0, slow worker $w1"
# held to the slow one's pace, the fast worker could not take the run over
check "ssp:2: the slow worker ran its part (steps $w0 and $w1)" \
  test "${w1:-0}" -gt 0 -a "$(( ${w0:-0} + ${w1:-0} ))" = 400
stop_all

# ---- 5. a stranger with the wrong token ------------------------------------
start_ps 0
# the PS's listener is up (not a guess at how long it takes to start)
listening() {
  on "$(host_of ps 0)" ss -Hltn "sport = :$PORT" 2>/dev/null | grep -q .
}
check "stranger: the PS listens" wait_for 30 listening
out=$(on 6 env TESSERA_TOKEN=not-the-token TF_CONFIG="{\"cluster\":$CLUSTER}" \
      "$TESSERA" status --timeout 2 2>&1)
check "stranger: refused" grep -q "wrong cluster token" <<<"$out"
check "stranger: the PS logs the address" grep -q "10.231.0.6" "$WORK/ps0.log"
stop_all
finish
