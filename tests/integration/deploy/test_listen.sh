#!/usr/bin/env bash
# What a cluster manager's pods and probes need of the processes, in a
# network namespace of the test's own (unshare: its own loopback, ports and
# /etc/hosts; root only, else skipped, 77):
#  1. tessera status --probe: ps@HOST:PORT, worker:INDEX (from TF_CONFIG)
#     answer 0 with the process's line; nothing listening, or a wrong
#     token: 1 within the timeout, saying why; a bad probe: 2;
#  2. --idle-exit: a PS and a worker with no chief leave by themselves,
#     status 0, saying why; a bad duration is refused (2);
#  3. --idle-exit with a chief: PS and worker stay while it trains (longer
#     than the bound), and leave within the bound once it is killed -9;
#  4. dual stack: a PS whose host is a name listens on [::], and answers
#     over TCP on 127.0.0.1 and on ::1;
#  5. IPv6 only (127.0.0.1 removed from the namespace, every name resolves
#     to ::1, TCP only): the chief, a PS and a worker train the diabetes
#     job to its exact step count and `tessera status` reaches all three.
if [ -z "${TSR_LISTEN_NS:-}" ]; then
  if [ "$(id -u)" != 0 ] || ! unshare -n -m true 2>/dev/null; then
    echo "SKIP: needs root for a network and mount namespace of its own"
    exit 77
  fi
  TSR_LISTEN_NS=1 exec unshare -n -m bash "$0" "$@"
fi
ip link set lo up
. "$(dirname "$0")/../cluster/lib.sh"
hosts() { # the namespace's /etc/hosts: LINES
  printf '%s\n' "$@" >"$WORK/hosts"
  umount /etc/hosts 2>/dev/null
  mount --bind "$WORK/hosts" /etc/hosts
}
hosts "127.0.0.1 localhost" "::1 localhost"
gone() { ! kill -0 "$1" 2>/dev/null; }
rc_of() { wait "$1"; echo $?; }

# ---- 1. probes ------------------------------------------------------------------------
cluster 1 1
CP=${P[0]} PP=${P[1]} WP=${P[2]}
start_all
wait_for 20 "$TESSERA" status --probe "ps@127.0.0.1:$PP" --timeout 1 >/dev/null
out=$("$TESSERA" status --probe "ps@127.0.0.1:$PP" 2>&1); rc=$?
check "probe ps@127.0.0.1:$PP answers, 0 ($rc: $out)" \
  bash -c "[ $rc = 0 ] && grep -q '^ps@127.0.0.1:$PP 127.0.0.1:$PP up ' <<<'$out'"
out=$(TF_CONFIG=$(tf_config worker 0) "$TESSERA" status --probe worker:0 2>&1); rc=$?
check "probe worker:0 (TF_CONFIG) answers, 0 ($rc: $out)" \
  bash -c "[ $rc = 0 ] && grep -q '^worker:0 127.0.0.1:$WP idle ' <<<'$out'"
out=$("$TESSERA" status --probe "chief@127.0.0.1:$CP" --timeout 1 2>&1); rc=$?
check "probe of a port nobody listens on: 1, connection refused ($rc: $out)" \
  bash -c "[ $rc = 1 ] && grep -q 'connection refused' <<<'$out'"
out=$(TESSERA_TOKEN=wrong "$TESSERA" status --probe "ps@127.0.0.1:$PP" --timeout 2 2>&1); rc=$?
check "probe with a wrong token: 1, says so ($rc: $out)" \
  bash -c "[ $rc = 1 ] && grep -q 'wrong cluster token' <<<'$out'"
out=$("$TESSERA" status --probe "evaluator@127.0.0.1:$PP" 2>&1); rc=$?
check "probe of no role: 2, says what it expects ($rc)" \
  bash -c "[ $rc = 2 ] && grep -q 'expected ROLE@HOST:PORT or ROLE:INDEX' <<<'$out'"

# ---- 2. --idle-exit with no chief ------------------------------------------------------
kill -9 "${PIDS[ps0]}" "${PIDS[worker0]}"; wait 2>/dev/null
cluster 1 1
TF_CONFIG=$(tf_config ps 0) "$PS_BIN" --idle-exit 2s >"$WORK/idle_ps.log" 2>&1 & IP=$!
TF_CONFIG=$(tf_config worker 0) "$WK_BIN" --idle-exit 1.5 >"$WORK/idle_wk.log" 2>&1 & IW=$!
PIDS[idle_ps]=$IP PIDS[idle_wk]=$IW
check "no chief: the PS leaves by itself" wait_for 30 gone "$IP"
check "no chief: the worker leaves by itself" wait_for 30 gone "$IW"
check "no chief: the PS exits 0" test "$(rc_of "$IP")" = 0
check "no chief: the worker exits 0" test "$(rc_of "$IW")" = 0
check "no chief: each says why" bash -c "grep -q 'no chief at 127.0.0.1:.* for 2 s (--idle-exit, since this process started): leaving' '$WORK/idle_ps.log' &&
  grep -q 'no chief at 127.0.0.1:.* for 1.5 s (--idle-exit, since this process started)' '$WORK/idle_wk.log'"
msg=$(TF_CONFIG=$(tf_config ps 0) "$PS_BIN" --idle-exit 10x 2>&1); rc=$?
check "--idle-exit 10x: refused, 2, naming it ($rc)" \
  bash -c "[ $rc = 2 ] && grep -q -- '--idle-exit \"10x\": expected a duration' <<<'$msg'"
msg=$(TF_CONFIG=$(tf_config worker 0) "$WK_BIN" --idle-exit 0 2>&1); rc=$?
check "worker --idle-exit 0: refused, 2 ($rc)" test "$rc" = 2

# ---- 3. --idle-exit while a chief trains, then the chief killed --------------------------
write_diabetes_job "$WORK/long.json" ', "steps": 400000, "steps_per_closure": 20,
  "checkpoint": {"every_steps": 500}'
cluster 1 1
TF_CONFIG=$(tf_config ps 0) "$PS_BIN" --idle-exit 3 >"$WORK/stay_ps.log" 2>&1 & SP=$!
TF_CONFIG=$(tf_config worker 0) "$WK_BIN" --idle-exit 3 >"$WORK/stay_wk.log" 2>&1 & SW=$!
PIDS[stay_ps]=$SP PIDS[stay_wk]=$SW
t0=$SECONDS
start_chief --job "$WORK/long.json" --checkpoint-dir "$WORK/ck_long"
past() { [ "$(ckpt_step "$WORK/ck_long")" -gt 0 ] && [ $((SECONDS - t0)) -ge 6 ]; }
check "with a chief: training passes a checkpoint, 6 s (twice the bound) in" wait_for 120 past
check "with a chief: the PS and the worker are still there" \
  bash -c "kill -0 $SP && kill -0 $SW"
kill -9 "$CHIEF_PID"; wait "$CHIEF_PID" 2>/dev/null; unset 'PIDS[chief]'
check "chief killed: the PS leaves" wait_for 30 gone "$SP"
check "chief killed: the worker leaves" wait_for 30 gone "$SW"
check "chief killed: both exit 0" test "$(rc_of "$SP") $(rc_of "$SW")" = "0 0"
check "chief killed: the PS says it lost the chief it had" \
  grep -q 'for 3 s (--idle-exit, since it was last connected): leaving' "$WORK/stay_ps.log"

# ---- 4. dual stack ---------------------------------------------------------------------------
hosts "127.0.0.1 localhost" "::1 localhost tsr-dual"
read -r p1 p2 p3 <<<"$(free_ports 3)"
CLUSTER="{\"chief\":[\"tsr-dual:$p1\"],\"ps\":[\"tsr-dual:$p2\"],\"worker\":[\"tsr-dual:$p3\"]}"
TF_CONFIG=$(tf_config ps 0) "$PS_BIN" >"$WORK/dual_ps.log" 2>&1 & DP=$!
PIDS[dual_ps]=$DP
export TESSERA_RPC_TRANSPORT=tcp
wait_for 20 "$TESSERA" status --probe "ps@[::1]:$p2" --timeout 1 >/dev/null
check "dual stack: the PS named tsr-dual listens on [::]:$p2" \
  grep -q "serving on \[::\]:$p2 " "$WORK/dual_ps.log"
check "dual stack: it answers on ::1 (TCP)" "$TESSERA" status --probe "ps@[::1]:$p2"
check "dual stack: it answers on 127.0.0.1 (TCP)" "$TESSERA" status --probe "ps@127.0.0.1:$p2"
kill "$DP"; wait "$DP" 2>/dev/null

# ---- 5. IPv6 only ------------------------------------------------------------------------------
ip addr del 127.0.0.1/8 dev lo
hosts "::1 localhost tsr-chief tsr-ps tsr-worker"
check "the namespace has no IPv4 address" test -z "$(ip -4 -o addr show)"
read -r p1 p2 p3 <<<"$(free_ports 3)"
CLUSTER="{\"chief\":[\"tsr-chief:$p1\"],\"ps\":[\"tsr-ps:$p2\"],\"worker\":[\"tsr-worker:$p3\"]}"
NPS=1 NWK=1
: >"$WORK/ps0.log"; : >"$WORK/worker0.log"; : >"$WORK/chief.log"
start_all
write_diabetes_job "$WORK/v6.json" ', "steps": 1200, "steps_per_closure": 20'
start_chief --job "$WORK/v6.json" --summary-json "$WORK/v6.json.out"
ask() { TF_CONFIG=$(tf_config chief 0) "$TESSERA" status --timeout 2 >"$WORK/v6status.txt" 2>&1; }
check "IPv6 only: tessera status reaches the chief, the PS and the worker" \
  wait_for 60 ask
wait_chief 180
check "IPv6 only: the chief exits 0 ($CHIEF_RC)" test "$CHIEF_RC" = 0
check "IPv6 only: exact step count" \
  test "$(json_get "$WORK/v6.json.out" steps 2>/dev/null)" = 1200
check "IPv6 only: every process listened on [::]" bash -c "
  grep -q 'listening on \[::\]:$p1 ' '$WORK/chief.log' &&
  grep -q 'serving on \[::\]:$p2 ' '$WORK/ps0.log' &&
  grep -q 'listening on \[::\]:$p3 ' '$WORK/worker0.log'"
finish
