#!/usr/bin/env bash
# free_ports (tests/integration/cluster/lib.sh, through tsr-test-ports and
# tests/ports/ports.h), the ports every cluster test binds later:
#  1. the block: each port lies in 20000-32767, outside the kernel's
#     ephemeral range, claimed in the name of this test; with a block
#     that overlaps the ephemeral range, only the ports outside it;
#  2. two pickers at once never get the same port (40 rounds in a block of
#     32 ports, 12 each);
#  3. the ports a running test claimed are not handed out again, even
#     after the port itself was bound and closed (a PS killed, to be
#     started again on it): the rest of the block is, then "no free port";
#  4. once that test is killed -9, its claims are taken over; so is a
#     claim whose PID now belongs to another process;
#  5. claim-run (the sbatch script's 16 ports): consecutive, the first a
#     multiple of 16; bad requests are refused, naming the problem; a
#     release frees this test's claims only.
# Parts 2-4 use a claim folder of their own and a block below 20000 that
# nothing of the suite binds, checked free first.
. "$(dirname "$0")/../integration/cluster/lib.sh"
read -r EPH_LO EPH_HI </proc/sys/net/ipv4/ip_local_port_range
ALL_DIR=/tmp/tessera-test-ports

# in_block LO HI PORT...: every PORT lies in LO-HI, none in the ephemeral
# range, and there are as many as expected (EXPECT)
in_block() {
  local lo=$1 hi=$2 p n=0; shift 2
  for p in "$@"; do
    [ "$p" -ge "$lo" ] && [ "$p" -le "$hi" ] || return 1
    [ "$p" -lt "$EPH_LO" ] || [ "$p" -gt "$EPH_HI" ] || return 1
    n=$((n + 1))
  done
  [ "$n" = "$EXPECT" ]
}
# disjoint LIST LIST: no port in both (and none twice in one)
disjoint() {
  [ -z "$(printf '%s\n' $1 $2 | sort | uniq -d)" ]
}
same_set() {
  [ "$(printf '%s\n' $1 | sort -n)" = "$(printf '%s\n' $2 | sort -n)" ]
}
claimed_by() { # PID PORT...: each claim file names PID
  local pid=$1 p; shift
  for p in "$@"; do
    [ "$(cut -d' ' -f1 "$CLAIMS/$p" 2>/dev/null)" = "$pid" ] || return 1
  done
}

# ---- 1. the block ---------------------------------------------------------
CLAIMS=$ALL_DIR
got=$(free_ports 8)
EXPECT=8
check "8 ports, all in 20000-32767 and outside $EPH_LO-$EPH_HI ($got)" \
  in_block 20000 32767 $got
check "each claimed in this test's name" claimed_by $$ $got
"$PORTS_BIN" release $$
check "released: the claims are gone" bash -c "! ls $(printf "$ALL_DIR/%s " $got) 2>/dev/null"

mkdir -p "$WORK/eph"
over=$(TSR_TEST_PORT_DIR=$WORK/eph TSR_TEST_PORTS=$((EPH_HI - 3))-$((EPH_HI + 4)) \
  free_ports 4)
EXPECT=4
check "a block over the ephemeral range's end: only the 4 ports past it ($over)" \
  same_set "$over" "$(seq $((EPH_HI + 1)) $((EPH_HI + 4)))"
msg=$(TSR_TEST_PORT_DIR=$WORK/eph TSR_TEST_PORTS=$((EPH_HI - 3))-$((EPH_HI + 4)) \
  free_ports 1 2>&1); rc=$?
check "... and no fifth: 1, saying so ($rc: $msg)" \
  bash -c "[ $rc = 1 ] && grep -q 'only 0 free' <<<'$msg'"

# ---- a block of 32 ports of the test's own, free now ---------------------
export TSR_TEST_PORT_DIR=$WORK/claims
CLAIMS=$TSR_TEST_PORT_DIR
all_free() { # LO HI
  /usr/bin/python3 - "$1" "$2" <<'PY'
import socket, sys
for p in range(int(sys.argv[1]), int(sys.argv[2]) + 1):
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", p))
    except OSError:
        sys.exit(1)
    finally:
        s.close()
PY
}
LO=
for _ in $(seq 20); do
  lo=$((10000 + 32 * (RANDOM % 300)))
  if all_free $lo $((lo + 31)); then LO=$lo; break; fi
done
if [ -z "$LO" ]; then
  echo "FAIL no block of 32 free ports in 10000-19599"; FAILS=$((FAILS + 1))
  finish; exit
fi
HI=$((LO + 31))
export TSR_TEST_PORTS=$LO-$HI
echo "block $TSR_TEST_PORTS"

# ---- 2. two pickers at once ------------------------------------------------
EXPECT=12
bad=
for round in $(seq 40); do
  free_ports 12 >"$WORK/a" 2>&1 & A=$!
  free_ports 12 >"$WORK/b" 2>&1 & B=$!
  wait $A; ra=$?
  wait $B; rb=$?
  a=$(cat "$WORK/a") b=$(cat "$WORK/b")
  if [ $ra != 0 ] || [ $rb != 0 ] || ! in_block $LO $HI $a ||
     ! in_block $LO $HI $b || ! disjoint "$a" "$b"; then
    bad="round $round: [$a] [$b]"; break
  fi
  "$PORTS_BIN" release $$
done
check "two pickers at once, 40 rounds: 12 ports each, never one in both ${bad:+($bad)}" \
  test -z "$bad"

# ---- 3. the claims of a running test -----------------------------------------
# another test: claims 16 ports, binds one and closes it (a PS of its that
# is down), and lives on
bash -c '. "$1/tests/integration/cluster/lib.sh"; echo "$WORK" >"$2/other.work"
  free_ports 16 >"$2/other.ports" || exit 1
  read -r p _ <"$2/other.ports"
  /usr/bin/python3 -c "import socket,sys; s=socket.socket(); s.bind((\"127.0.0.1\", int(sys.argv[1]))); s.listen(1); s.close()" "$p"
  echo bound >"$2/other.bound"; exec sleep 600' _ "$SRC" "$WORK" &
OTHER=$!
PIDS[other]=$OTHER
wait_for 20 test -s "$WORK/other.bound"
theirs=$(cat "$WORK/other.ports" 2>/dev/null)
EXPECT=16
check "the other test got 16 ports, claimed in its name ($theirs)" \
  bash -c "$(declare -f in_block claimed_by); EPH_LO=$EPH_LO EPH_HI=$EPH_HI \
    EXPECT=16 CLAIMS=$CLAIMS; in_block $LO $HI $theirs && claimed_by $OTHER $theirs"
mine=$(free_ports 16); rc=$?
check "this test gets the other 16 ($mine)" \
  bash -c "[ $rc = 0 ] && $(declare -f disjoint in_block); EPH_LO=$EPH_LO \
    EPH_HI=$EPH_HI EXPECT=16; in_block $LO $HI $mine && disjoint '$theirs' '$mine'"
msg=$(free_ports 1 2>&1); rc=$?
check "... and no more while the other lives, its closed port included: 1 ($rc: $msg)" \
  bash -c "[ $rc = 1 ] && grep -q 'cannot claim 1 port in $LO-$HI' <<<'$msg'"
read -r one _ <<<"$mine"
"$PORTS_BIN" release $$ "$one"
check "release PORT: that claim goes, the other test's stay" \
  bash -c "[ ! -e '$CLAIMS/$one' ] && $(declare -f claimed_by); CLAIMS=$CLAIMS;
    claimed_by $OTHER $theirs"
again=$(free_ports 1)
check "... and the one port free is that one ($again)" test "$again" = "$one"

# ---- 4. killed -9: its claims taken over -------------------------------------
kill -9 $OTHER; wait $OTHER 2>/dev/null; unset 'PIDS[other]'
rm -rf "$(cat "$WORK/other.work")"
took=$(free_ports 16); rc=$?
check "the killed test's 16 ports are taken over ($took)" \
  bash -c "[ $rc = 0 ] && $(declare -f same_set); same_set '$took' '$theirs'"
"$PORTS_BIN" release $$
read -r p _ <<<"$took"
sleep 600 & LIVE=$!
PIDS[live]=$LIVE
echo "$LIVE 1" >"$CLAIMS/$p" # a live PID, started at another time
free_ports 32 >"$WORK/all" 2>&1; rc=$?
check "a claim whose PID now belongs to another process is taken over ($rc)" \
  bash -c "[ $rc = 0 ] && grep -qw $p '$WORK/all'"
"$PORTS_BIN" release $$

# ---- 5. claim-run, bad requests ------------------------------------------------
unset TSR_TEST_PORTS TSR_TEST_PORT_DIR
CLAIMS=$ALL_DIR
run=$("$PORTS_BIN" claim-run 16 $$)
read -r first _ <<<"$run"
check "claim-run 16: 16 consecutive, the first a multiple of 16 ($run)" \
  bash -c "[ '$run' = '$(seq -s ' ' "${first:-0}" $((${first:-0} + 15)))' ] &&
    [ $((${first:-1} % 16)) = 0 ] && [ ${first:-0} -ge 20000 ] && [ $((${first:-0} + 15)) -le 32767 ]"
"$PORTS_BIN" release $$
bad_req() { # WANT_RC WANT_TEXT ARGS...
  local want=$1 text=$2 out rc; shift 2
  out=$("$@" 2>&1); rc=$?
  [ "$rc" = "$want" ] && grep -qF -- "$text" <<<"$out"
}
check "claim 0: refused, 2" bad_req 2 'N "0" is not a number above 0' "$PORTS_BIN" claim 0 $$
check "claim x: refused, 2" bad_req 2 'N "x" is not a number' "$PORTS_BIN" claim x $$
check "an owner not running: refused, 1, naming it" \
  bad_req 1 "PID 2147483000, is not running" "$PORTS_BIN" claim 1 2147483000
check "TSR_TEST_PORTS=9-8: refused, 2, naming it" \
  bad_req 2 'TSR_TEST_PORTS "9-8": expected LO-HI' env TSR_TEST_PORTS=9-8 "$PORTS_BIN" claim 1 $$
check "release of another's port leaves it" \
  bash -c "p=\$('$PORTS_BIN' claim 1 $LIVE) && '$PORTS_BIN' release $$ \$p &&
    [ -e '$ALL_DIR/'\$p ] && '$PORTS_BIN' release $LIVE \$p && [ ! -e '$ALL_DIR/'\$p ]"
# another local user's traps: a link in place of the lock, a folder of
# theirs; the file the link names keeps its mode
planted() {
  local d v rc
  d=$(mktemp -d) v=$(mktemp)
  chmod 1777 "$d"; chmod 600 "$v"; ln -s "$v" "$d/.lock"
  TSR_TEST_PORT_DIR=$d "$PORTS_BIN" claim 1 $$ >/dev/null 2>&1; rc=$?
  [ "$rc" != 0 ] && [ "$(stat -c %a "$v")" = 600 ]; rc=$?
  rm -rf "$d" "$v"
  return $rc
}
check "a link planted as the lock: refused, its target untouched" planted
if [ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1; then
  theirs() {
    local d rc
    d=$(mktemp -d); chmod 1777 "$d"; chown nobody "$d"
    bad_req 1 "is not a folder of this user nor root's sticky one" \
      env TSR_TEST_PORT_DIR="$d" "$PORTS_BIN" claim 1 $$; rc=$?
    rm -rf "$d"
    return $rc
  }
  check "a claim folder another user made: refused, naming it" theirs
fi
finish
