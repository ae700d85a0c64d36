#!/usr/bin/env bash
# The billion-parameter run on 4 PS + 2 workers on this machine: by
# default deploy/jobs/ctr_1b_full.json, every row of its embedding tables
# (1.0e9 parameters) and wide weights (6.25e7) held with its Adagrad slot
# from the start (8.5 GB over 4 PS), async, trained BENCH_LARGE_STEPS
# steps (2000) with a checkpoint every BENCH_LARGE_EVERY (1000) steps
# taken while training goes on, every BENCH_LARGE_FULL_EVERY-th (2nd)
# whole and the others increments, then restored by a chief started
# again on the same checkpoint folder. Every figure is measured in this
# run:
#
#   large_bytes_per_param_overhead  the raw floats a PS holds (parameters
#       x (1 + slots) x 4 B, from `tessera partition`) over its peak
#       resident memory, the worst PS (goal 0.87: index, allocator and the
#       rows a checkpoint keeps cost under 15 %)
#   large_train_during_ckpt_vs_without  examples/s while a checkpoint is
#       being written over examples/s while none is (from the workers'
#       closures in the trace; goal 0.8)
#   large_ckpt_write_vs_disk  a full checkpoint's bytes over the time from
#       SAVE to every file written, against the disk's sequential write
#       with fdatasync (dd, 1 GiB, in the same folder, same run; goal 0.8)
#   large_ckpt_restore_vs_disk  the same for the restore (goal 0.5)
#   large_incremental_ckpt_bytes_vs_full  a whole checkpoint's bytes over
#       an increment's (BENCH_LARGE_EVERY steps after it), printed with
#       the fraction of rows the increment holds
#
# Printed beside them, from the PS's and the chief's own log lines: the
# CPU seconds each checkpoint's writing took on all PS, and the chief's
# check of its files (thread CPU time: what a checkpoint takes from
# training, which a loaded machine changes little, unlike the rates).
#
# Not part of a plain `--benchmark` run: it needs 9 GiB or more and many
# minutes, and the 8.5 GB run belongs on a machine nobody else is
# squeezing. Run it with
#   TSR_BENCH_LARGE=1 meson test -C build --benchmark large --verbose
# It refuses to start (exit 77, a skip) with less than BENCH_LARGE_MIN_GIB
# (default 12) GiB available. BENCH_LARGE_JOB: another job (ctr_1b.json:
# rows made on first touch); BENCH_LARGE_DIR: where the checkpoints go
# (default a fresh folder under /tmp).
. "$TSR_SOURCE_DIR/tests/integration/cluster/lib.sh"
if [ "${TSR_BENCH_LARGE:-}" != 1 ]; then
  echo "bench_large: set TSR_BENCH_LARGE=1 to run it (minutes, GiBs)"
  exit 77
fi
MIN=${BENCH_LARGE_MIN_GIB:-12}
avail=$(awk '/MemAvailable/ {printf "%d", $2 / 1048576}' /proc/meminfo)
echo "memory available: $avail GiB (at least $MIN needed)"
if [ "$avail" -lt "$MIN" ]; then
  echo "bench_large: not enough memory available; not started"
  exit 77
fi
JOB=${BENCH_LARGE_JOB:-$TSR_SOURCE_DIR/deploy/jobs/ctr_1b_full.json}
STEPS=${BENCH_LARGE_STEPS:-2000}
EVERY=${BENCH_LARGE_EVERY:-1000}
FULL=${BENCH_LARGE_FULL_EVERY:-2}
DIR=${BENCH_LARGE_DIR:-$WORK}
mkdir -p "$DIR"
CK="$DIR/ckpt_1b"
rm -rf "$CK"

# the disk, in the checkpoint's folder
dd_out=$(dd if=/dev/zero of="$DIR/dd.bin" bs=8M count=128 conv=fdatasync 2>&1)
rm -f "$DIR/dd.bin"
disk=$(/usr/bin/python3 - "$dd_out" <<'PY'
import re, sys
m = re.search(r"(\d+) bytes .* copied, ([0-9.]+) s", sys.argv[1])
print(f"{int(m.group(1)) / float(m.group(2)) / 1e9:.3f}" if m else "nan")
PY
)
# what each PS holds in raw floats (parameters x (1 + slots) x 4 B)
"$TESSERA" partition --job "$JOB" --ps 4 --json >"$WORK/partition.json"

# run_local TAG ARGS...: tessera local with 4 PS and 2 workers; samples
# every PS's resident memory every 0.5 s into $WORK/rss_TAG (time, pid,
# kB, of them kB of mapped files)
run_local() {
  local tag=$1
  shift
  "$TESSERA" local --ps 4 --workers 2 --bin-dir "$WORK/bin" \
    --job "$JOB" --checkpoint-dir "$CK" --trace "$WORK/trace_$tag.json" \
    --summary-json "$WORK/s_$tag.json" "$@" >"$WORK/local_$tag.log" 2>&1 &
  local lp=$! deadline=$((SECONDS + 3000))
  : >"$WORK/rss_$tag"
  while kill -0 "$lp" 2>/dev/null; do
    if [ $SECONDS -ge $deadline ]; then kill "$lp"; break; fi
    local now
    now=$(date +%s.%N)
    for p in $(pgrep -P "$lp" -x tessera-ps); do
      r=$(awk '/VmRSS/ {r = $2} /RssFile/ {f = $2}
               END {if (r != "") print r, f}' "/proc/$p/status" 2>/dev/null)
      [ -n "$r" ] && echo "$now $p $r" >>"$WORK/rss_$tag"
    done
    sleep 0.5
  done
  wait "$lp"
}

# every binary in one folder for tessera local's --bin-dir
mkdir -p "$WORK/bin"
ln -sf "$PS_BIN" "$WK_BIN" "$CH_BIN" "$WORK/bin/"

t0=$SECONDS
run_local train --steps "$STEPS" --set "checkpoint.every_steps=$EVERY" \
  --set checkpoint.keep=100 --set "checkpoint.full_every=$FULL"
rc_train=$?
train_s=$((SECONDS - t0))
du -sb "$CK"/ckpt-* >"$WORK/ck_sizes" 2>/dev/null
run_local restore --steps "$STEPS"
rc_restore=$?
/usr/bin/python3 - "$WORK" "$disk" "$rc_train" "$rc_restore" "$train_s" \
  "$JOB" <<'PY'
import json, os, sys
work, disk, rc_t, rc_r, train_s, job = sys.argv[1:]
disk = float(disk)

def trace(tag):
    try:
        ev = json.load(open(os.path.join(work, f"trace_{tag}.json")))
    except (OSError, ValueError):
        return []
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    return [e for e in ev if e.get("ph") == "X"]

def named(evs, name):
    return [e for e in evs if e.get("name") == name]

def summary(tag):
    try:
        return json.load(open(os.path.join(work, f"s_{tag}.json")))
    except (OSError, ValueError):
        return {}

s = summary("train")
ev = trace("train")
batch = json.load(open(job))["batch_size"]
# the checkpoints: folder sizes, their write spans (SAVE to every file
# written), in order
sizes = {}
for line in open(os.path.join(work, "ck_sizes")):
    b, path = line.split()
    sizes[int(path.rsplit("-", 1)[1])] = int(b)
spans = sorted(named(ev, "checkpoint"), key=lambda e: e["ts"])
steps_ck = sorted(sizes)
# the workers' closures: examples and when
clos = [e for e in ev if str(e.get("name", "")).startswith("closure of")]
t_first = min(e["ts"] for e in clos) if clos else 0
t_last = max(e["ts"] + e["dur"] for e in clos) if clos else 0
wins = [(e["ts"], e["ts"] + e["dur"]) for e in spans
        if e["ts"] < t_last and e["ts"] + e["dur"] > t_first]

def overlap(a0, a1, b0, b1):
    return max(0, min(a1, b1) - max(a0, b0))

ex_in = ex_all = 0.0
for c in clos:
    n = int(c["name"].split()[2]) * batch
    ex_all += n
    c0, c1 = c["ts"], c["ts"] + max(c["dur"], 1)
    ex_in += n * sum(overlap(c0, c1, w0, w1) for w0, w1 in wins) / (c1 - c0)
t_in = sum(overlap(w0, w1, t_first, t_last) for w0, w1 in wins)
t_all = t_last - t_first
rate_in = ex_in / (t_in / 1e6) if t_in > 0 else float("nan")
rate_out = (ex_all - ex_in) / ((t_all - t_in) / 1e6) if t_all > t_in else float("nan")
# resident memory, per PS: peak, and peak outside checkpoint writes
part = json.load(open(os.path.join(work, "partition.json")))
raw = part["ps_bytes"]
rss = {}
for line in open(os.path.join(work, "rss_train")):
    t, pid, kb = line.split()[:3]
    rss.setdefault(pid, []).append((float(t) * 1e6, int(kb) * 1024))
busy = [(e["ts"], e["ts"] + e["dur"]) for e in spans]
peaks, quiet = [], []
for pid, xs in rss.items():
    peaks.append(max(v for _, v in xs))
    q = [v for t, v in xs if not any(w0 <= t <= w1 for w0, w1 in busy)]
    quiet.append(max(q) if q else float("nan"))
order = sorted(range(len(peaks)), key=lambda i: -peaks[i])
per_ps_raw = max(raw)
full = max(sizes.values()) if sizes else 0
fulls = [(st, sizes[st]) for st in steps_ck if sizes[st] >= 0.9 * full]
# the write span of each checkpoint: in step order, the spans as the chief
# took them (a checkpoint skipped as a repeat of the last has no span)
write_rate = float("nan")
if len(spans) == len(steps_ck):
    rates = [sizes[st] / (sp["dur"] / 1e6) for st, sp in zip(steps_ck, spans)
             if sizes[st] >= 0.9 * full]
    write_rate = max(rates) / 1e9 if rates else float("nan")
incs = [(st, b) for st, b in ((st, sizes[st]) for st in steps_ck)
        if b < 0.9 * full]
# the restore: each PS's peak resident memory, and the mapped files' part
rrss, rfile = {}, {}
for line in open(os.path.join(work, "rss_restore")):
    t, pid, kb, fkb = (line.split() + ["0"])[:4]
    rrss[pid] = max(rrss.get(pid, 0), int(kb) * 1024)
    rfile[pid] = max(rfile.get(pid, 0), int(fkb) * 1024)
rs = named(trace("restore"), "restore")
rs_s = max(e["dur"] for e in rs) / 1e6 if rs else float("nan")
print()
print(f"{'figure':52s} {'value':>14s}")
print(f"{'exit status train / restore':52s} {rc_t + ' / ' + rc_r:>14s}")
print(f"{'steps, examples':52s} {str(s.get('steps', '?')) + ', ' + str(s.get('examples', '?')):>14s}")
print(f"{'examples/s (4 PS + 2 workers)':52s} {s.get('examples_per_sec', float('nan')):14.1f}")
print(f"{'  while a checkpoint is written':52s} {rate_in:14.1f}")
print(f"{'  while none is':52s} {rate_out:14.1f}")
print(f"{'time with a checkpoint being written (s of s)':52s} {t_in / 1e6:7.0f} of {t_all / 1e6:4.0f}")
print(f"{'wall of the training run (s)':52s} {float(train_s):14.0f}")
for k, i in enumerate(order):
    print(f"{'PS #%d raw floats (MB)' % (k + 1):52s} {raw[k] / 1e6:14.1f}")
    print(f"{'PS #%d peak resident (MB), without a checkpoint' % (k + 1):52s} {peaks[i] / 1e6:9.1f} {quiet[i] / 1e6:6.1f}")
print(f"{'peak RSS / raw floats, worst PS':52s} {max(peaks) / per_ps_raw:14.3f}")
print(f"{'the same outside checkpoint writes':52s} {max(quiet) / per_ps_raw:14.3f}")
for st in steps_ck:
    print(f"{'checkpoint of step %d (GB)' % st:52s} {sizes[st] / 1e9:14.3f}")
for sp in spans:
    print(f"{'  written in (s)':52s} {sp['dur'] / 1e6:14.1f}")
print(f"{'full checkpoint write (GB/s)':52s} {write_rate:14.3f}")
print(f"{'checkpoint restore (s)':52s} {rs_s:14.2f}")
if rrss:
    print(f"{'restore: worst PS peak resident (MB), of it files':52s} {max(rrss.values()) / 1e6:9.1f} {max(rfile.values()) / 1e6:6.1f}")
    print(f"{'restore: peak RSS / raw floats, worst PS':52s} {max(rrss.values()) / per_ps_raw:14.3f}")
# the CPU a checkpoint costs: the PS's writing jobs and the chief's check
# of the files (their own log lines: thread CPU time, which a loaded
# machine changes little, unlike the wall-clock rates above)
import re
wr, ck = {}, {}
try:
    log = open(os.path.join(work, "local_train.log")).read()
except OSError:
    log = ""
for m in re.finditer(r'checkpoint "[^"]*" of step (\d+): \d+ file\(s\), '
                     r'([0-9.]+) MB written in [0-9.]+ s, ([0-9.]+) s of CPU',
                     log):
    a = wr.setdefault(int(m.group(1)), [0.0, 0.0])
    a[0] += float(m.group(2)) / 1e3
    a[1] += float(m.group(3))
for m in re.finditer(r'checkpoint of step (\d+): \d+ file\(s\), ([0-9.]+) '
                     r'MB checked in [0-9.]+ s, ([0-9.]+) s of CPU', log):
    ck[int(m.group(1))] = (float(m.group(2)) / 1e3, float(m.group(3)))
for st in sorted(wr):
    gb, cpu = wr[st]
    print(f"{'checkpoint of step %d: PS writing CPU, all PS (s/GB)' % st:52s} {cpu:7.2f} {cpu / gb if gb else float('nan'):6.2f}")
    if st in ck:
        print(f"{'  the chief check of its files: CPU (s/GB)':52s} {ck[st][1]:7.2f} {ck[st][1] / ck[st][0] if ck[st][0] else float('nan'):6.2f}")
print(f"{'disk sequential write, dd fdatasync (GB/s)':52s} {disk:14.3f}")
print(f"RATIO large_bytes_per_param_overhead {per_ps_raw / max(peaks):.3f} goal 0.87")
print(f"RATIO large_train_during_ckpt_vs_without {rate_in / rate_out:.2f} goal 0.8")
print(f"RATIO large_ckpt_write_vs_disk {write_rate / disk:.2f} goal 0.8")
print(f"RATIO large_ckpt_restore_vs_disk {full / 1e9 / rs_s / disk:.2f} goal 0.5")
if incs:
    # the rows an increment holds, over the rows a full one does (their
    # sizes are rows x the same bytes per row, but for the headers)
    st, b = incs[-1]
    print(f"{'increment of step %d: fraction of rows held' % st:52s} {b / full:14.4f}")
    print(f"RATIO large_incremental_ckpt_bytes_vs_full {full / b:.1f} goal 1")
PY
[ "$rc_train" = 0 ] && [ "$rc_restore" = 0 ]
