#!/usr/bin/env bash
# A full disk under the checkpoints (a small tmpfs this test mounts; root
# only, else skipped with 77): checkpoints fail, training goes on and ends
# with the exact step count, the summary (--summary-json and its last
# lines) names the failed checkpoints and the last good one, and no
# half-written checkpoint folder is left (they stayed, and the run said
# nothing of them).
. "$(dirname "$0")/lib.sh"

[ "$(id -u)" = 0 ] || { echo "skip: mounting a tmpfs needs root"; exit 77; }
mkdir -p "$WORK/full"
mount -t tmpfs -o size=112k tsr_full "$WORK/full" 2>/dev/null ||
  { echo "skip: cannot mount a tmpfs here"; exit 77; }
trap 'umount "$WORK/full" 2>/dev/null; cleanup' EXIT

all_committed() { # every ckpt-* folder under $1 has its manifest
  local d
  for d in "$1"/ckpt-*; do
    [ -d "$d" ] || continue
    [ -f "$d/manifest.json" ] || { echo "partial: $d"; return 1; }
  done
  return 0
}

write_diabetes_job "$WORK/job.json" ', "steps": 3000, "steps_per_closure": 20,
  "checkpoint": {"dir": "full/ckpt", "every_steps": 300, "keep": 100}'
cluster 2 2
start_all
start_chief --job "$WORK/job.json" --summary-json "$WORK/s.json"
wait_chief 240
check "the run ends (exit 0)" test "$CHIEF_RC" = 0
check "exact step count" test "$(json_get "$WORK/s.json" steps)" = 3000
/usr/bin/python3 - "$WORK/s.json" "$(ckpt_step "$WORK/full/ckpt")" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["checkpoints"]
print("summary:", s["last_good"], [f["step"] for f in s["failed"]],
      s["failed"][0]["error"] if s["failed"] else "")
assert s["failed"], "no failed checkpoint named"
assert s["last_good"] == int(sys.argv[2]), (s["last_good"], sys.argv[2])
assert all(f["step"] > s["last_good"] for f in s["failed"])
assert "space" in s["failed"][0]["error"].lower(), s["failed"][0]
PY
check "the summary names the failed ones and the last good one" test $? = 0
check "the last lines say so" \
  bash -c "tail -n 12 '$WORK/chief.log' | grep -q 'FAILED .* checkpoint(s): step' && tail -n 12 '$WORK/chief.log' | grep -q 'last good       step '"
check "no half-written checkpoint folder" all_committed "$WORK/full/ckpt"
for k in "${!PIDS[@]}"; do kill -9 "${PIDS[$k]}" 2>/dev/null; done
wait 2>/dev/null
umount "$WORK/full"
trap cleanup EXIT
finish
