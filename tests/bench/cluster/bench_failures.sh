#!/usr/bin/env bash
# What a lost process costs a running job, on the wide-and-deep CTR model
# (deploy/jobs/ctr_wide_deep.json: embedding tables and dense layers over
# 3 PS, 2 workers, async, a checkpoint every BENCH_FAIL_CKPT steps), from
# the chief's --trace (every closure's end, on one clock with the kills).
# Each kill comes 200 steps after the first checkpoint past 40% of the
# run, so the lost PS has 200 steps of its own to lose and the next
# checkpoint's pause is not inside the time measured:
#
#  1. a normal run: the steps per second, and the longest time the step
#     counter stood still (a checkpoint's pause, a slow closure): the
#     baseline the runs with a failure are held against;
#  2. worker:1 killed with -9 and not started again:
#     lost_worker_stall_s, the longest time the step counter stood still
#     from the kill to the end (the issue's figure is the kill to the next
#     step committed by the others; this bounds it and includes the pause
#     of the next checkpoint, which is where a lost worker's closures used
#     to hold the run for the closure timeout);
#  3. ps:1 killed with -9 and started again 1 s later (a
#     supervisor's restart): large_ps_recovery_s, from the kill to the
#     first closure's end from which the next 2 s run at 90% of the steps
#     per second of the 10 s before the kill; the floor of it is the restart itself (the kill to
#     the new process serving, from its log) plus its restore (the trace's
#     "ps:1 restored alone", or "restore" when every PS restored); and the
#     steps re-done on the PS that stayed up: the steps counted more than
#     once (a rewind runs every step since the checkpoint again:
#     steps_run - steps), or the applies of their shards in the final
#     checkpoint over the steps (each step applies each dense shard once:
#     a closure cut short and run again shows there), the larger.
#
# Ends with RATIO lines, higher better:
#   lost_worker_stall_vs_normal  normal longest stand-still / the run's
#   large_ps_recovery_vs_restart the restart's floor / large_ps_recovery_s
#   large_ps_recovery_work_kept  1 - steps re-done on the other PS / the
#                                steps between the checkpoint and the kill
# BENCH_FAIL_STEPS (6000), BENCH_FAIL_CKPT (1000) and
# BENCH_CLOSURE_TIMEOUT (600, the chief's --closure-timeout) change the run.
. "$TSR_SOURCE_DIR/tests/integration/cluster/lib.sh"
STEPS=${BENCH_FAIL_STEPS:-6000}
EVERY=${BENCH_FAIL_CKPT:-1000}
CTO=${BENCH_CLOSURE_TIMEOUT:-600}
JOB="$TSR_SOURCE_DIR/deploy/jobs/ctr_wide_deep.json"

now_us() { date +%s%6N; }
status_step() {
  TF_CONFIG="{\"cluster\":$CLUSTER}" "$TESSERA" status 2>/dev/null |
    sed -n 's|^chief:0 .* step \([0-9]*\)/.*|\1|p'
}
at_step() { local s; s=$(status_step); [ -n "$s" ] && [ "$s" -ge "$1" ]; }
ckpt_past() { [ "$(ckpt_step "$1")" -ge "$2" ]; }

# run TAG ACTION: a run of the job, ACTION (none, worker, ps) 200 steps
# after the first checkpoint past 40%
run() {
  local tag=$1 action=$2
  cluster 3 2
  : >"$WORK/ps1.log"
  start_all
  start_chief --job "$JOB" --steps "$STEPS" --set eval_every_steps=0 \
    --set steps_per_closure=10 --set checkpoint.every_steps="$EVERY" \
    --checkpoint-dir "$WORK/ckpt_$tag" --closure-timeout "$CTO" \
    --trace "$WORK/trace_$tag.json" --summary-json "$WORK/s_$tag.json"
  echo 0 >"$WORK/kill_$tag"
  if [ "$action" != none ]; then
    if wait_for 300 ckpt_past "$WORK/ckpt_$tag" $((STEPS * 2 / 5)) &&
       wait_for 300 at_step $(($(ckpt_step "$WORK/ckpt_$tag") + 200)); then
      now_us >"$WORK/kill_$tag"
      local v=ps1
      [ "$action" = worker ] && v=worker1
      kill -9 "${PIDS[$v]}"
      wait "${PIDS[$v]}" 2>/dev/null
      unset "PIDS[$v]"
      if [ "$action" = ps ]; then
        sleep 1
        start_ps 1
      fi
    fi
  fi
  wait_chief 1800
  echo "$CHIEF_RC" >"$WORK/rc_$tag"
  "$TESSERA" ckpt inspect "$WORK/ckpt_$tag" >"$WORK/inspect_$tag" 2>&1
  cp "$WORK/ps1.log" "$WORK/ps1_$tag.txt"
  mv "$WORK/chief.log" "$WORK/chief_$tag.txt"
  for k in "${!PIDS[@]}"; do kill -9 "${PIDS[$k]}" 2>/dev/null; unset "PIDS[$k]"; done
  wait 2>/dev/null
}

run normal none
run worker worker
run ps ps

/usr/bin/python3 - "$WORK" "$STEPS" <<'PY'
import datetime, glob, json, os, re, sys
work, steps = sys.argv[1], int(sys.argv[2])

def closures(tag):
    """(end time in s, steps) of every closure the chief counted."""
    try:
        ev = json.load(open(os.path.join(work, f"trace_{tag}.json")))
    except (OSError, ValueError):
        return []
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    out = []
    for e in ev:
        m = re.match(r"closure of (\d+) steps", e.get("name", ""))
        if e.get("ph") == "X" and m:
            out.append(((e["ts"] + e["dur"]) / 1e6, int(m.group(1))))
    return sorted(out)

def span(tag, name):
    try:
        ev = json.load(open(os.path.join(work, f"trace_{tag}.json")))
    except (OSError, ValueError):
        return None
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    d = [e["dur"] / 1e6 for e in ev if e.get("ph") == "X" and e.get("name") == name]
    return max(d) if d else None

def longest_still(cl, t0):
    ends = [t for t, _ in cl if t >= t0]
    if t0 > 0:
        before = [t for t, _ in cl if t < t0]
        if before:
            ends.insert(0, before[-1])
    return max((b - a for a, b in zip(ends, ends[1:])), default=float("nan"))

def rate(cl, a, b):
    n = sum(s for t, s in cl if a <= t < b)
    return n / (b - a) if b > a else float("nan")

def kill_at(tag):
    return int(open(os.path.join(work, f"kill_{tag}")).read()) / 1e6

def rc(tag):
    return open(os.path.join(work, f"rc_{tag}")).read().strip()

def applies(tag):
    out = {}
    for line in open(os.path.join(work, f"inspect_{tag}")):
        # NAME [SHAPE] KIND PARTS ROWS OPTIMIZER SLOTS APPLIES BYTES
        m = re.match(r"(\S+)\s+\[[^\]]*\]\s+(dense|row-sparse)\s.*\s(\d+)\s+\d+\s*$", line)
        if m:
            out[m.group(1)] = int(m.group(3))
    return out

def ps_of(tag):
    """The PS that wrote each variable's part 0 (whose applies the inspect
    shows)."""
    d = sorted(glob.glob(os.path.join(work, f"ckpt_{tag}", "ckpt-*")))[-1]
    m = json.load(open(os.path.join(d, "manifest.json")))
    from urllib.parse import unquote
    out = {}
    for f in m["files"]:
        name, part = unquote(f["name"]).split(".part-")
        if part.startswith("0-of-"):
            out[name] = f["ps"]
    return out

def serving_again(tag, after):
    for line in open(os.path.join(work, f"ps1_{tag}.txt")):
        if "serving on" not in line:
            continue
        t = datetime.datetime.strptime(line.split()[0], "%Y-%m-%dT%H:%M:%S.%fZ")
        t = t.replace(tzinfo=datetime.timezone.utc).timestamp()
        if t > after:
            return t
    return None

nan = float("nan")
normal = closures("normal")
t_n = (normal[-1][0] - normal[0][0]) if normal else nan
base_rate = sum(s for _, s in normal) / t_n if normal else nan
base_still = longest_still(normal, 0)

wk = closures("worker")
kw = kill_at("worker")
stall = longest_still(wk, kw) if kw else nan

ps = closures("ps")
kp = kill_at("ps")
# before: the 10 s before the kill (from the first closure at the
# earliest); back: the first closure's end after the kill from which the
# next 2 s run at 90% of that (windows of a few closures are too noisy on
# a shared machine)
t_first = ps[0][0] if ps else 0
before = rate(ps, max(t_first, kp - 10), kp) if kp else nan
rec = nan
if kp:
    for t, _ in ps:
        if t > kp and rate(ps, t, t + 2.0) >= 0.9 * before:
            rec = t - kp
            break
up = serving_again("ps", kp) if kp else None
restore = span("ps", "ps:1 restored alone")
if restore is None:
    restore = span("ps", "restore")
floor = (up - kp + restore) if up and restore is not None else nan
ap, where = applies("ps"), ps_of("ps")
kept = [v for v, p in where.items() if p != 1 and v in ap]
redone = max((ap[v] - steps for v in kept), default=nan)
if redone == redone and redone < 0:
    redone = 0
try:
    s_ps = json.load(open(os.path.join(work, "s_ps.json")))
    r = s_ps["steps_run"] - s_ps["steps"]
    redone = r if redone != redone else max(redone, r)
except (OSError, ValueError, KeyError):
    pass
since = nan
if kp and ps:
    # the steps counted before the kill, less the step of the checkpoint
    # the lost PS (alone, or every PS) went back to
    killed_step = sum(s for t, s in ps if t < kp)
    m = re.search(r"restored the checkpoint of step (\d+)",
                  open(os.path.join(work, "chief_ps.txt")).read())
    if m:
        since = killed_step - int(m.group(1))

print()
print(f"{'figure':52s} {'value':>12s}")
print(f"{'exit status normal / worker / ps':52s} {rc('normal') + ' / ' + rc('worker') + ' / ' + rc('ps'):>12s}")
print(f"{'normal: steps/s':52s} {base_rate:12.1f}")
print(f"{'normal: longest stand-still (s)':52s} {base_still:12.3f}")
print(f"{'lost_worker_stall_s (goal < 10)':52s} {stall:12.3f}")
print(f"{'ps run: steps/s before the kill':52s} {before:12.1f}")
print(f"{'large_ps_recovery_s (back at 90% of before)':52s} {rec:12.3f}")
print(f"{'  of which the PS down (supervisor 1 s) and up again':52s} {(up - kp) if up else nan:12.3f}")
print(f"{'  of which its restore alone':52s} {restore if restore is not None else nan:12.3f}")
print(f"{'steps between the checkpoint and the kill':52s} {since:12.0f}")
print(f"{'steps re-done on the PS that stayed up (goal 0)':52s} {redone:12.0f}")
for v in sorted(ap):
    print(f"{'  applies of ' + v + ' on ps:' + str(where.get(v, '?')):52s} {ap[v]:12d}")
print(f"RATIO lost_worker_stall_vs_normal {base_still / stall:.3f} goal 0.5")
print(f"RATIO large_ps_recovery_vs_restart {floor / rec:.3f} goal 0.8")
kept_ratio = 1 - redone / since if since and since == since and since > 0 else nan
print(f"RATIO large_ps_recovery_work_kept {kept_ratio:.3f} goal 1.0")
PY
