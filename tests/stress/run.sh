#!/usr/bin/env bash
# The stress gate: the integration tests that kill processes (whole
# clusters with failures, network namespaces, the chief's error paths, the
# launcher, the kill storms) run N times in a row while a competing CPU
# load runs (stress-ng, one busy worker per core), each test through
# `meson test` in an already built folder. Prints a line per finished test
# run as it goes, then one line per test with its passes and failures;
# every failed run's log is saved under a folder it names. Exit status 0
# when every run passed, 1 when any failed, 2 on bad arguments.
#
#   tests/stress/run.sh N [--build DIR] [--logs DIR] [--load K] [TEST...]
#
#   N            rounds (each runs every test once)
#   --build DIR  the meson build folder (default build/, built beforehand:
#                the gate runs with --no-rebuild)
#   --logs DIR   where failed runs' logs go (default a fresh
#                /tmp/tsr_stress_XXXXXX)
#   --load K     stress-ng CPU workers (default: the number of cores);
#                0 for no load
#   TEST...      meson test names (default: the list below)
# The storm test runs with a fresh seed each round; its seed is in its log
# (and in the line of a failed run).
set -u

DEFAULT_TESTS=(cluster_failures cluster_lost_worker cluster_lost_ps
               cluster_lost_ps_chain
               netns_cluster cluster_chief_errors cluster_disk_full
               chief_local chief_local_cluster rpc_procs worker_errors
               worker_synckill worker_syncback cluster_hybrid
               worker_hybrid_errors worker_ring_newrun worker_ring_rewind
               worker_ring_break
               cluster_ckpt_lost_save storm)

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
usage() { sed -n '2,22p' "$0"; }

N=
BUILD=$root/build
LOGS=
LOAD=$(nproc)
TESTS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$2; shift 2 ;;
    --logs) LOGS=$2; shift 2 ;;
    --load) LOAD=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "run.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    *) if [ -z "$N" ]; then N=$1; else TESTS+=("$1"); fi; shift ;;
  esac
done
if ! [[ ${N:-} =~ ^[1-9][0-9]*$ ]]; then
  echo "run.sh: N (the number of rounds) must be a whole number >= 1, got '${N:-}'" >&2
  usage >&2; exit 2
fi
if ! [[ $LOAD =~ ^[0-9]+$ ]]; then
  echo "run.sh: --load '$LOAD' is not a whole number" >&2; exit 2
fi
if [ ! -f "$BUILD/build.ninja" ]; then
  echo "run.sh: '$BUILD' is not a configured meson build folder (meson setup $BUILD; ninja -C $BUILD)" >&2
  exit 2
fi
[ ${#TESTS[@]} = 0 ] && TESTS=("${DEFAULT_TESTS[@]}")
known=$(meson test -C "$BUILD" --list 2>/dev/null | sed 's/.* \/ //')
for t in "${TESTS[@]}"; do
  if ! grep -qx "$t" <<<"$known"; then
    echo "run.sh: no test named '$t' in $BUILD (meson test -C $BUILD --list)" >&2; exit 2
  fi
done
if [ "$LOAD" -gt 0 ] && ! command -v stress-ng >/dev/null; then
  echo "run.sh: stress-ng is not installed (deploy/setup.sh test installs it; or --load 0)" >&2
  exit 2
fi
LOGS=${LOGS:-$(mktemp -d /tmp/tsr_stress_XXXXXX)}
mkdir -p "$LOGS" || exit 2

LOAD_PID=
stop_load() {
  if [ -n "$LOAD_PID" ]; then kill "$LOAD_PID" 2>/dev/null; wait "$LOAD_PID" 2>/dev/null; fi
  LOAD_PID=
}
trap 'stop_load; exit 130' INT TERM
trap stop_load EXIT
if [ "$LOAD" -gt 0 ]; then
  # it runs for as long as the gate does; the gate stops it at the end
  stress-ng --cpu "$LOAD" --cpu-method all --timeout 0 --quiet &
  LOAD_PID=$!
fi

declare -A PASS FAIL
for t in "${TESTS[@]}"; do PASS[$t]=0; FAIL[$t]=0; done
echo "stress: $N rounds of ${TESTS[*]}; build $BUILD; load: stress-ng --cpu $LOAD; failed runs' logs under $LOGS"
start=$SECONDS
for ((r = 1; r <= N; r++)); do
  for t in "${TESTS[@]}"; do
    t0=$SECONDS
    # a fresh storm seed each round (printed by the test itself)
    TSR_STORM_SEED=$(( $(od -An -tu2 -N2 /dev/urandom) * 1000 )) \
    TSR_STORM_KEEP=$LOGS/$t.round$r/runs \
      meson test -C "$BUILD" --no-rebuild --num-processes 1 --print-errorlogs \
      --logbase "stress-$$" "$t" >"$LOGS/.out" 2>&1
    rc=$?
    if [ "$rc" = 0 ]; then
      PASS[$t]=$((PASS[$t] + 1)); res=pass
      rmdir "$LOGS/$t.round$r" 2>/dev/null
    else
      FAIL[$t]=$((FAIL[$t] + 1)); res=FAIL
      mkdir -p "$LOGS/$t.round$r"   # (the storm's failed runs are in runs/)
      cp "$BUILD/meson-logs/stress-$$.txt" "$LOGS/$t.round$r/testlog.txt" 2>/dev/null
      cp "$LOGS/.out" "$LOGS/$t.round$r/meson_test.out"
      # the folders of the processes' logs the test kept, named in its output
      grep -o '/tmp/tsr_[A-Za-z_]*[A-Za-z0-9_]*' "$LOGS/.out" | sort -u >"$LOGS/$t.round$r/kept_folders.txt"
    fi
    printf 'stress: round %d/%d %-22s %s (%d s)\n' "$r" "$N" "$t" "$res" $((SECONDS - t0))
  done
done
rm -f "$LOGS/.out" "$BUILD"/meson-logs/stress-$$.*
stop_load

echo
el=$((SECONDS - start))
echo "stress: $N rounds in $((el / 60)) min $((el % 60)) s under stress-ng --cpu $LOAD"
bad=0
for t in "${TESTS[@]}"; do
  printf '%-22s %3d passed %3d failed\n' "$t" "${PASS[$t]}" "${FAIL[$t]}"
  [ "${FAIL[$t]}" != 0 ] && bad=1
done
if [ "$bad" != 0 ]; then
  echo "failed runs' logs: $LOGS"
  exit 1
fi
rmdir "$LOGS" 2>/dev/null
exit 0
