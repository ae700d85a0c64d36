#!/usr/bin/env bash
# How evenly the main job's bytes (variables and optimizer slots) spread
# over its 2 parameter servers, with the default (balanced) placement and
# with TensorFlow's round-robin layout and max_shards=1, as the chief
# plans them (`tessera partition --job`). The baseline is a perfectly even
# split; RATIO is mean/max PS bytes (1.0 even, 0.5 everything on one of
# two PS).
set -euo pipefail
TESSERA="$TSR_BUILD_DIR/chief/tessera"
JOB="$TSR_SOURCE_DIR/deploy/jobs/fashion_mnist.json"
ratio() {
  "$TESSERA" partition --job "$JOB" --ps 2 --json "$@" |
    /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); b=d["ps_bytes"]; print("%d %d %.3f" % (b[0], b[1], (sum(b)/len(b))/max(b)))'
}
read -r b0 b1 bal < <(ratio)
read -r r0 r1 rr < <(ratio --placement round_robin --max-shards 1)
printf '%-34s %14s %14s %10s\n' "placement (main job, 2 PS)" "ps:0 bytes" "ps:1 bytes" "mean/max"
printf '%-34s %14s %14s %10s\n' "balanced (default)" "$b0" "$b1" "$bal"
printf '%-34s %14s %14s %10s\n' "round_robin, max_shards=1 (TF)" "$r0" "$r1" "$rr"
echo "RATIO placement_balance_main_job $bal goal 0.8"
echo "RATIO placement_balance_main_job_round_robin $rr goal none"
