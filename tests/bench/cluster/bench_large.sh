#!/usr/bin/env bash
# The billion-parameter run (deploy/jobs/ctr_1b.json: embedding tables of
# 1.0e9 parameters and 62.5 million wide weights, Adagrad, async) on
# 4 PS + 2 workers on this machine, trained for the job's steps with a
# checkpoint at the end, then restored by a chief started again on the
# same checkpoint folder. Prints examples/s, each PS's peak resident
# memory, and the checkpoint's write and restore rates against the
# disk's sequential write rate measured in the same run, in the same
# folder (dd, 1 GiB, fdatasync). Ends with RATIO lines, higher better.
#
# Not part of a plain `--benchmark` run: it needs several GiB of memory
# and minutes. Run it with
#   TSR_BENCH_LARGE=1 meson test -C build --benchmark large --verbose
# It refuses to start (exit 77, a skip) with less than BENCH_LARGE_MIN_GIB
# (default 8) GiB available. BENCH_LARGE_DIR: where the checkpoint goes
# (default a fresh folder under /tmp); BENCH_LARGE_STEPS overrides the
# job's steps.
. "$TSR_SOURCE_DIR/tests/integration/cluster/lib.sh"
if [ "${TSR_BENCH_LARGE:-}" != 1 ]; then
  echo "bench_large: set TSR_BENCH_LARGE=1 to run it (minutes, GiBs)"
  exit 77
fi
MIN=${BENCH_LARGE_MIN_GIB:-8}
avail=$(awk '/MemAvailable/ {printf "%d", $2 / 1048576}' /proc/meminfo)
echo "memory available: $avail GiB (at least $MIN needed)"
if [ "$avail" -lt "$MIN" ]; then
  echo "bench_large: not enough memory available; not started"
  exit 77
fi
JOB="$TSR_SOURCE_DIR/deploy/jobs/ctr_1b.json"
DIR=${BENCH_LARGE_DIR:-$WORK}
mkdir -p "$DIR"
CK="$DIR/ckpt_1b"
rm -rf "$CK"
STEPS=()
[ -n "${BENCH_LARGE_STEPS:-}" ] && STEPS=(--steps "$BENCH_LARGE_STEPS")

# the disk, in the checkpoint's folder
dd_out=$(dd if=/dev/zero of="$DIR/dd.bin" bs=8M count=128 conv=fdatasync 2>&1)
rm -f "$DIR/dd.bin"
disk=$(/usr/bin/python3 - "$dd_out" <<'PY'
import re, sys
m = re.search(r"(\d+) bytes .* copied, ([0-9.]+) s", sys.argv[1])
print(f"{int(m.group(1)) / float(m.group(2)) / 1e9:.3f}" if m else "nan")
PY
)

# run_local TAG ARGS...: tessera local with 4 PS and 2 workers; records
# the peak resident memory of each PS (sampled every 0.2 s) in $WORK/rss_TAG
run_local() {
  local tag=$1
  shift
  "$TESSERA" local --ps 4 --workers 2 --bin-dir "$WORK/bin" \
    --job "$JOB" --checkpoint-dir "$CK" --trace "$WORK/trace_$tag.json" \
    --summary-json "$WORK/s_$tag.json" "$@" >"$WORK/local_$tag.log" 2>&1 &
  local lp=$! deadline=$((SECONDS + 1800))
  declare -A peak
  while kill -0 "$lp" 2>/dev/null; do
    if [ $SECONDS -ge $deadline ]; then kill "$lp"; break; fi
    for p in $(pgrep -P "$lp" -x tessera-ps); do
      r=$(awk '/VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null)
      [ -n "$r" ] && [ "$r" -gt "${peak[$p]:-0}" ] && peak[$p]=$r
    done
    sleep 0.2
  done
  wait "$lp"
  local rc=$?
  for p in "${!peak[@]}"; do echo "${peak[$p]}"; done >"$WORK/rss_$tag"
  return $rc
}

# every binary in one folder for tessera local's --bin-dir
mkdir -p "$WORK/bin"
ln -sf "$PS_BIN" "$WK_BIN" "$CH_BIN" "$WORK/bin/"

t0=$SECONDS
run_local train "${STEPS[@]}"
rc_train=$?
train_s=$((SECONDS - t0))
run_local restore "${STEPS[@]}"
rc_restore=$?
ck_bytes=$(du -sb "$CK" | cut -f1)
/usr/bin/python3 - "$WORK" "$disk" "$ck_bytes" "$rc_train" "$rc_restore" \
  "$train_s" <<'PY'
import json, os, sys
work, disk, ck_bytes, rc_t, rc_r, train_s = sys.argv[1:]
disk, ck_bytes = float(disk), int(ck_bytes)

def events(tag, name):
    try:
        ev = json.load(open(os.path.join(work, f"trace_{tag}.json")))
    except (OSError, ValueError):
        return []
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    return [e for e in ev if e.get("ph") == "X" and e.get("name") == name]

def summary(tag):
    try:
        return json.load(open(os.path.join(work, f"s_{tag}.json")))
    except (OSError, ValueError):
        return {}

s = summary("train")
ck = events("train", "checkpoint")
rs = events("restore", "restore")
rss = [int(x) for x in open(os.path.join(work, "rss_train")).read().split()]
ck_s = max(e["dur"] for e in ck) / 1e6 if ck else float("nan")
rs_s = max(e["dur"] for e in rs) / 1e6 if rs else float("nan")
gb = ck_bytes / 1e9
print()
print(f"{'figure':44s} {'value':>14s}")
print(f"{'exit status train / restore':44s} {rc_t + ' / ' + rc_r:>14s}")
print(f"{'steps, examples':44s} {str(s.get('steps', '?')) + ', ' + str(s.get('examples', '?')):>14s}")
print(f"{'examples/s (4 PS + 2 workers)':44s} {s.get('examples_per_sec', float('nan')):14.1f}")
print(f"{'wall of the training run (s)':44s} {float(train_s):14.0f}")
for i, r in enumerate(sorted(rss, reverse=True)):
    print(f"{'PS peak resident memory (MiB), #' + str(i + 1):44s} {r / 1024:14.1f}")
print(f"{'checkpoint size (GB)':44s} {gb:14.3f}")
print(f"{'checkpoint write (s)':44s} {ck_s:14.2f}")
print(f"{'checkpoint restore (s)':44s} {rs_s:14.2f}")
print(f"{'checkpoint write (GB/s)':44s} {gb / ck_s:14.3f}")
print(f"{'checkpoint restore (GB/s)':44s} {gb / rs_s:14.3f}")
print(f"{'disk sequential write, dd fdatasync (GB/s)':44s} {disk:14.3f}")
print(f"RATIO large_ckpt_write_vs_disk {gb / ck_s / disk:.2f} goal 0.5")
print(f"RATIO large_ckpt_restore_vs_disk {gb / rs_s / disk:.2f} goal 0.5")
PY
[ "$rc_train" = 0 ] && [ "$rc_restore" = 0 ]
