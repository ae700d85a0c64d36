#!/usr/bin/env bash
# A local user of another uid, without the token, squatting the same-host
# socket names of a cluster (squatter.py): training must come out exactly
# as without it, or fail with a clear line; never altered.
#
# The cluster (chief, one PS, one worker) runs in a network namespace made
# here, its addresses a host name (as under Slurm or compose) that
# resolves to an address of the namespace, so the PS and the worker bind
# every address and own the wildcard names tessera-rpc/any:PORT.
#   0. a reference run, nobody squatting
#   1. the squatter (uid 65534) holds the exact names tessera-rpc/IP:PORT
#      that clients try first and relays them to the servers' own
#      sockets, negating every float of every request payload
#   2. the squatter started first holds every name a client tries (exact
#      and wildcard), relaying to TCP and negating the same way
# Both runs must end with the reference's loss, bit for bit; the
# squatter must have been tried (so the test tested something) and every
# client must name the socket it refused and the uid it found there.
# Needs root (namespaces, another uid); skips (77) without it.
. "$(dirname "$0")/../cluster/lib.sh"

if [ "$(id -u)" != 0 ]; then
  echo "network namespaces and a second uid need root: skipped"; exit 77
fi
SQUAT_UID=65534
NS="tsrsq$$"
HOSTNAME_=sqnode
IP=10.231.77.1
cleanup_ns() {
  ip netns pids "$NS" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns del "$NS" 2>/dev/null
  rm -rf "/etc/netns/$NS"
}
trap 'cleanup_ns; cleanup' EXIT
# `ip netns exec` shows the namespace /etc/netns/NS/hosts as /etc/hosts
if ! ip netns add "$NS" || ! mkdir -p "/etc/netns/$NS" ||
   ! echo "$IP $HOSTNAME_" >"/etc/netns/$NS/hosts"; then
  echo "cannot make a network namespace with its own hosts file: skipped"
  exit 77
fi
ip -n "$NS" link set lo up
ip -n "$NS" addr add "$IP/32" dev lo
on() { ip netns exec "$NS" "$@"; }

PC=2222 PP=2223 PW=2224
CLUSTER="{\"chief\":[\"$HOSTNAME_:$PC\"],\"ps\":[\"$HOSTNAME_:$PP\"],\"worker\":[\"$HOSTNAME_:$PW\"]}"
write_diabetes_job "$WORK/job.json" ', "steps": 400, "steps_per_closure": 20'

stop_all() {
  for k in "${!PIDS[@]}"; do kill -9 "${PIDS[$k]}" 2>/dev/null; unset "PIDS[$k]"; done
  ip netns pids "$NS" 2>/dev/null | xargs -r kill -9 2>/dev/null
  { wait; } 2>/dev/null
}

# run TAG: the cluster trains the job; CHIEF_RC, logs $WORK/TAG.*.log
run() {
  local t=$1
  on env TF_CONFIG="$(tf_config ps 0)" "$PS_BIN" >"$WORK/$t.ps.log" 2>&1 &
  PIDS[ps]=$!
  on env TF_CONFIG="$(tf_config worker 0)" "$WK_BIN" --device cpu \
    >"$WORK/$t.worker.log" 2>&1 &
  PIDS[worker]=$!
  on env TF_CONFIG="$(tf_config chief 0)" "$CH_BIN" --wait-timeout 30 \
    --ps-timeout 30 --job "$WORK/job.json" --summary-json "$WORK/$t.json" \
    >"$WORK/$t.chief.log" 2>&1 &
  PIDS[chief]=$!
  CHIEF_PID=$!
  wait_chief 120
  stop_all
}

# squat MODE: the squatter, as another uid, on the cluster's names
squat() {
  : >"$WORK/squat-$1.log" # there before the first poll of it
  on setpriv --reuid=$SQUAT_UID --regid=$SQUAT_UID --clear-groups \
    /usr/bin/python3 - "$1" "$IP:$PC" "$IP:$PP" "$IP:$PW" \
    <"$SRC/tests/integration/netns/squatter.py" >"$WORK/squat-$1.log" 2>&1 &
  PIDS[squatter]=$!
  local want=3
  [ "$1" = tcp ] && want=6
  listening() { [ "$(grep -c ^listening "$WORK/squat-$2.log")" = "$1" ]; }
  check "squatter ($1): holds its $want names" wait_for 20 listening $want "$1"
}

loss() { json_get "$WORK/$1.json" eval.loss 2>/dev/null || echo none; }

# ---- 0. reference ------------------------------------------------------------
run ref
check "reference: chief exits 0" test "$CHIEF_RC" = 0
REF=$(loss ref)
echo "reference loss: $REF"

# every line of TAG's logs naming a refused socket and the squatter's uid
refusal_lines() { # tag name
  cat "$WORK/$1".*.log | grep -F "$2" | grep -c "uid $SQUAT_UID"
}

# ---- 1. exact names squatted, relayed to the servers' own sockets ----------
squat unix
run exact
check "exact names: chief exits 0" test "$CHIEF_RC" = 0
echo "loss with the squatter on the exact names: $(loss exact)"
check "exact names: loss unaltered ($(loss exact) = $REF)" test "$(loss exact)" = "$REF"
check "exact names: clients tried the squatter's names" grep -q ^accepted "$WORK/squat-unix.log"
check "exact names: no plain frame went through the squatter" \
  bash -c "! grep -q 'plain' '$WORK/squat-unix.log'"
for p in $PP $PW; do
  check "exact names: a client names @tessera-rpc/$IP:$p and uid $SQUAT_UID" \
    test "$(refusal_lines exact "@tessera-rpc/$IP:$p")" -ge 1
done
stop_all

# ---- 2. every name squatted first, relayed to TCP ---------------------------
squat tcp
run every
check "every name: chief exits 0" test "$CHIEF_RC" = 0
echo "loss with the squatter on every name: $(loss every)"
check "every name: loss unaltered ($(loss every) = $REF)" test "$(loss every)" = "$REF"
check "every name: clients tried the squatter's names" grep -q ^accepted "$WORK/squat-tcp.log"
check "every name: the servers say their name was taken" \
  grep -q "no same-host socket" "$WORK/every.ps.log"
for p in $PP $PW; do
  check "every name: a client names @tessera-rpc/any:$p and uid $SQUAT_UID" \
    test "$(refusal_lines every "@tessera-rpc/any:$p")" -ge 1
done
stop_all
finish
