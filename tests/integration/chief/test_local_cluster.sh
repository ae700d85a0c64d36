#!/usr/bin/env bash
# `tessera local` with the real tessera-ps, tessera-worker and tessera-chief
# (found from the build tree next to tessera): a short run trains to the
# exact step count with TensorBoard events, metrics.jsonl, report.html and
# the summary; then a worker killed with -9 is restarted, a PS sent SIGTERM
# mid-job exits non-zero and is restarted (it exited 0 and was left down),
# and SIGINT to the launcher stops every process and returns the chief's
# status; last, an epochs-based job with --evaluator ends as soon as the
# evaluator has seen the job's last checkpoint (it waited out its idle
# timeout, 10 minutes). Every wait has a deadline; every process started is
# killed on exit.
set -u
BUILD=${TSR_BUILD_DIR:?TSR_BUILD_DIR not set}
SRC=${TSR_SOURCE_DIR:?TSR_SOURCE_DIR not set}
TESSERA=$BUILD/chief/tessera
JOB=$SRC/deploy/jobs/diabetes.json
WORK=$(mktemp -d /tmp/tsr_local_XXXXXX)
export TESSERA_LOG=info
# tessera local's private folder (cluster map and token) goes in here.
unset XDG_RUNTIME_DIR
export TMPDIR=$WORK
FAILS=0
LPID=

cleanup() {
  [ -n "$LPID" ] && kill -9 "$LPID" 2>/dev/null
  for p in $(started_pids); do kill -9 "$p" 2>/dev/null; done
  if [ "$FAILS" != 0 ]; then
    echo "logs kept in $WORK"
    for f in "$WORK"/*.txt; do echo "---- $f"; tail -n 40 "$f"; done
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT

fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
ok() { echo "ok: $*"; }
started_pids() {
  cat "$WORK"/*.txt 2>/dev/null | grep -o 'started (pid [0-9]*' | grep -o '[0-9]*$'
}
# wait_for FILE PATTERN SECONDS
wait_for() {
  local end=$((SECONDS + $3))
  while [ $SECONDS -lt $end ]; do
    grep -q -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}
none_left() {
  for p in $(started_pids); do
    if kill -0 "$p" 2>/dev/null; then echo "pid $p still alive"; return 1; fi
  done
  return 0
}

[ -f "$JOB" ] || { echo "no $JOB"; exit 1; }

# 1. A short run end to end.
out=$WORK/run1.txt
timeout 120 "$TESSERA" local --ps 2 --workers 2 --job "$JOB" --steps 300 \
  --logdir "$WORK/logs" --summary-json "$WORK/summary.json" \
  --grace-ms 5000 >"$out" 2>&1
rc=$?
[ $rc = 0 ] && ok "run exits 0" || fail "run exited $rc"
/usr/bin/python3 - "$WORK/summary.json" <<'PY' && ok "summary: 300 steps" || fail "summary.json"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["steps"] == 300, s
assert s["examples"] > 0 and s["final_loss"] is not None, s
PY
ls "$WORK"/logs/events.out.tfevents.* >/dev/null 2>&1 && ok "event file" \
  || fail "no event file in $WORK/logs"
[ -s "$WORK/logs/metrics.jsonl" ] && ok "metrics.jsonl" || fail "metrics.jsonl"
grep -q '<svg' "$WORK/logs/report.html" 2>/dev/null && ok "report.html" \
  || fail "report.html"
for t in ps:0 ps:1 worker:0 worker:1 chief:0; do
  grep -q "^$(printf '%-8s' $t) | " "$out" || fail "no line prefixed $t"
done
grep -q "TensorBoard logs: $WORK/logs" "$out" && ok "says where the logs are" \
  || fail "TensorBoard location not printed"
none_left && ok "no process left" || fail "processes left after run 1"

# 2. A worker killed with -9 comes back; SIGINT stops everyone.
out=$WORK/run2.txt
"$TESSERA" local --ps 2 --workers 2 --job "$JOB" --steps 100000000 \
  --restart-backoff-ms 100 --grace-ms 5000 >"$out" 2>&1 &
LPID=$!
if wait_for "$out" "worker:1 (.*) ready" 60; then
  w1=$(grep -o 'worker:1 started (pid [0-9]*' "$out" | head -1 | grep -o '[0-9]*$')
  kill -9 "$w1"
  if wait_for "$out" "worker:1 (.*) is back" 60; then
    ok "killed worker restarted and back"
  else
    fail "worker:1 did not come back"
  fi
  # `tessera status` reaches every process with what the launcher printed.
  cmd=$(grep -o 'tessera status --cluster [^ ]* --token-file [^ ]*' "$out")
  if [ -n "$cmd" ]; then
    # shellcheck disable=SC2086 # the command line as printed
    timeout 30 $BUILD/chief/$cmd >"$WORK/status.txt" 2>&1
    src=$?
    if [ $src = 0 ] && grep -q '^worker:1 ' "$WORK/status.txt" \
        && grep -q '^ps:1 ' "$WORK/status.txt"; then
      ok "tessera status sees the local cluster"
    else
      fail "tessera status exited $src: $(cat "$WORK/status.txt")"
    fi
  else
    fail "no tessera status command printed"
  fi
  # a PS told to stop mid-job leaves an unfinished job: restarted
  p1=$(grep -o 'ps:1 started (pid [0-9]*' "$out" | head -1 | grep -o '[0-9]*$')
  kill -TERM "$p1"
  if wait_for "$out" "ps:1 exited with status 1; restarting" 30; then
    ok "a PS stopped mid-job exits 1 and is restarted"
  else
    fail "ps:1 was not restarted after SIGTERM"
  fi
  if wait_for "$out" "recovered\|no checkpoint to restore" 60; then
    ok "the chief recovered from the lost PS"
  else
    fail "no recovery after ps:1 came back"
  fi
else
  fail "worker:1 never became ready"
fi
kill -INT "$LPID"
end=$((SECONDS + 30))
while kill -0 "$LPID" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.1; done
if kill -0 "$LPID" 2>/dev/null; then
  fail "tessera local still running 30 s after SIGINT"
else
  wait "$LPID"
  rc=$?
  LPID=
  grep -q "chief exit status $rc;" "$out" && ok "exit status $rc is the chief's" \
    || fail "exit status $rc is not the chief's"
  grep -q "restarts: 1 ps, 1 worker" "$out" && ok "one PS and one worker restart counted" \
    || fail "restart count"
fi
none_left && ok "no process left after SIGINT" || fail "processes left after SIGINT"
ls -d "$WORK"/tessera-local-* >/dev/null 2>&1 \
  && fail "the status folder was left behind" || ok "status folder removed"

# 3. An epochs-based job with the evaluator sidecar ends with its last
# checkpoint.
out=$WORK/run3.txt
t0=$SECONDS
timeout 90 "$TESSERA" local --ps 1 --workers 2 --evaluator --job "$JOB" \
  --epochs 20 --checkpoint-dir "$WORK/ck3" --grace-ms 5000 >"$out" 2>&1
rc=$?
[ $rc = 0 ] && ok "evaluator run exits 0 in $((SECONDS - t0)) s" \
  || fail "evaluator run exited $rc after $((SECONDS - t0)) s"
grep -q "is the job's last; stopping" "$out" \
  && ok "the evaluator stops after the job's last checkpoint" \
  || fail "the evaluator did not see the last checkpoint"
grep -q "evaluator:0 exited with status 0" "$out" && ok "evaluator exits 0" \
  || fail "evaluator exit"
none_left && ok "no process left after the evaluator run" \
  || fail "processes left after run 3"

echo "$FAILS failure(s)"
[ "$FAILS" = 0 ]
