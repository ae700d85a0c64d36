#!/bin/bash
# Checks the clock protocol's Spin model (clock.pml) in both modes:
#   safety   every assertion (ssp: no read more than S clocks ahead of a
#            member; sync: every applied step has the gradient of every
#            member that owes it, exactly once, from that step's
#            parameters) and no invalid end state (every process waits:
#            a hang, since no call has a deadline in the model);
#   liveness no cycle that never completes a step (-DNP, pan -l);
#   and that without the PS client's give-up (-DNO_GIVE_UP) it does find
#   the hang (an invalid end state).
# Bounds (2 workers, 2 PS, FAILS failures, TOTAL steps) keep each check to
# seconds. Skips (77) where spin or a C compiler is missing.
# Usage: run.sh [workdir]   (TSR_MODEL_FAILS, TSR_MODEL_TOTAL override)
set -u
here=$(cd "$(dirname "$0")" && pwd)
command -v spin >/dev/null || { echo "SKIP: spin not installed"; exit 77; }
cc=${CC:-cc}
command -v "$cc" >/dev/null || { echo "SKIP: no C compiler"; exit 77; }
work=${1:-$(mktemp -d)}
mkdir -p "$work"
[ $# -ge 1 ] || trap 'rm -rf "$work"' EXIT
fails=${TSR_MODEL_FAILS:-1}
total=${TSR_MODEL_TOTAL:-2}
rc=0

# check NAME MODE SAFETY|LIVENESS [extra -D...]
check() {
  local name=$1 mode=$2 kind=$3; shift 3
  local d="$work/$name"
  mkdir -p "$d"
  cp "$here/clock.pml" "$d/"
  # -O0: pan.c compiles ten times faster and runs about as fast
  local ccflags=(-O0 -w) panflags=(-m200000)
  if [ "$kind" = liveness ]; then
    ccflags+=(-DNP); panflags+=(-l)
  else
    ccflags+=(-DSAFETY)
  fi
  if ! (cd "$d" && spin -DMODE="$mode" -DFAILS="$fails" -DTOTAL="$total" \
          -DMAXINF=1 "$@" -a clock.pml >spin.out 2>&1 &&
        "$cc" "${ccflags[@]}" -o pan pan.c >cc.out 2>&1); then
    echo "FAIL $name: the model does not build"; cat "$d"/spin.out "$d"/cc.out
    rc=1; return
  fi
  local t0=$SECONDS
  (cd "$d" && ./pan "${panflags[@]}" >pan.out 2>&1)
  local states errs
  states=$(sed -n 's/^ *\([0-9e+.]*\) states, stored.*/\1/p' "$d/pan.out")
  errs=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' "$d/pan.out")
  if [ "$errs" != 0 ] || grep -q "max search depth too small" "$d/pan.out"; then
    echo "FAIL $name ($kind): errors ${errs:-?}"
    cat "$d/pan.out"
    if [ -f "$d/clock.pml.trail" ]; then
      (cd "$d" && spin -DMODE="$mode" -DFAILS="$fails" -DTOTAL="$total" \
         -DMAXINF=1 "$@" -t -p -g clock.pml | tail -80)
    fi
    rc=1
  else
    echo "ok   $name ($kind): $states states, $((SECONDS - t0)) s"
  fi
}

# The model must see the hang the PS client's give-up prevents: without
# it (-DNO_GIVE_UP), a worker's pull refused by a PS started again without
# its shards waits for ever for its pull held on the other PS, and the
# chief for that closure before it restores.
finds() {
  local name=$1 mode=$2 want=$3; shift 3
  local d="$work/$name"
  mkdir -p "$d"
  cp "$here/clock.pml" "$d/"
  if ! (cd "$d" && spin -DMODE="$mode" -DFAILS="$fails" -DTOTAL="$total" \
          -DMAXINF=1 "$@" -a clock.pml >spin.out 2>&1 &&
        "$cc" -O0 -w -DSAFETY -o pan pan.c >cc.out 2>&1); then
    echo "FAIL $name: the model does not build"; cat "$d"/spin.out "$d"/cc.out
    rc=1; return
  fi
  (cd "$d" && ./pan -m200000 >pan.out 2>&1)
  if grep -q "$want" "$d/pan.out"; then
    echo "ok   $name: the model finds it ($want)"
  else
    echo "FAIL $name: no '$want' found"; cat "$d/pan.out"; rc=1
  fi
}

check sync 2 safety
finds sync_no_give_up 2 "invalid end state" -DNO_GIVE_UP
check ssp 1 safety
check sync_live 2 liveness
check ssp_live 1 liveness
exit $rc
