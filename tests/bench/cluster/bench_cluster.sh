#!/usr/bin/env bash
# Examples per second of distributed training against standalone training
# of the same job measured in the same run: Fashion-MNIST MLP (784-256-128-10,
# batch 128) standalone, then on a cluster of 1 PS + 1 worker and of
# 2 PS + 2 workers, all on this machine (loopback). Reports the share of a
# worker's step time spent waiting on the network (pull + push).
# Ends with RATIO lines, higher better. On a 2-core machine the cluster's
# processes share the cores the standalone run has to itself, so the
# ratios measure the cost of the distribution, not a speed-up.
. "$TSR_SOURCE_DIR/tests/integration/cluster/lib.sh"
STEPS=${BENCH_STEPS:-400}
JOB="$TSR_SOURCE_DIR/deploy/jobs/fashion_mnist.json"

sa=$("$WK_BIN" --standalone --job "$JOB" --device cpu --steps "$STEPS" 2>/dev/null |
     sed -n 's/^final:.* \([0-9.]*\) examples\/s.*/\1/p')
echo "standalone: $sa examples/s"

run_cluster() { # nps nwk tag
  cluster "$1" "$2"
  start_all
  start_chief --job "$JOB" --steps "$STEPS" --set eval_every_steps=0 \
    --logdir "$WORK/logs_$3" --summary-json "$WORK/s_$3.json"
  wait_chief 600
  for k in "${!PIDS[@]}"; do kill -9 "${PIDS[$k]}" 2>/dev/null; unset "PIDS[$k]"; done
  wait 2>/dev/null
  /usr/bin/python3 - "$WORK/s_$3.json" "$WORK/logs_$3/metrics.jsonl" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
net = {}
for line in open(sys.argv[2]):
    r = json.loads(line)
    if r.get("tag", "").endswith("network_wait_share"):
        net[r["tag"]] = r["value"]
share = sum(net.values()) / len(net) if net else float("nan")
print(f'{s["examples_per_sec"]:.1f} {share:.3f}')
PY
}

read -r c1 n1 <<<"$(run_cluster 1 1 c1)"
read -r c2 n2 <<<"$(run_cluster 2 2 c2)"
printf '\n%-28s %14s %18s\n' "run" "examples/s" "network wait share"
printf '%-28s %14s %18s\n' "standalone (1 process)" "$sa" "-"
printf '%-28s %14s %18s\n' "1 PS + 1 worker" "$c1" "$n1"
printf '%-28s %14s %18s\n' "2 PS + 2 workers" "$c2" "$n2"
/usr/bin/python3 - "$sa" "$c1" "$c2" <<'PY'
import sys
sa, c1, c2 = map(float, sys.argv[1:])
print(f"RATIO cluster_fmnist_1w_vs_standalone {c1 / sa:.2f} goal 0.5")
print(f"RATIO cluster_fmnist_2w_vs_standalone {c2 / sa:.2f} goal 0.5")
PY
[ -n "$c1" ] && [ -n "$c2" ] && [ -n "$sa" ]
