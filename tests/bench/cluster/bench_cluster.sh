#!/usr/bin/env bash
# Examples per second of distributed training against standalone training
# of the same job measured in the same run, for the Fashion-MNIST MLP
# (784-256-128-10, batch 128) and the wide-and-deep CTR model
# (deploy/jobs/ctr_wide_deep.json: sparse embedding rows pulled and pushed
# by id): standalone, then on a cluster of 1 PS + 1 worker and of
# 2 PS + 2 workers, all on this machine (loopback). Reports the share of a
# worker's step time spent waiting on the network (pull + push).
# Ends with RATIO lines, higher better. On a 2-core machine the cluster's
# processes share the cores the standalone run has to itself, so the
# ratios measure the cost of the distribution, not a speed-up.
. "$TSR_SOURCE_DIR/tests/integration/cluster/lib.sh"
STEPS=${BENCH_STEPS:-400}
JOB="$TSR_SOURCE_DIR/deploy/jobs/fashion_mnist.json"

standalone() { # job steps
  "$WK_BIN" --standalone --job "$1" --device cpu --steps "$2" 2>/dev/null |
    sed -n 's/^final:.* \([0-9.]*\) examples\/s.*/\1/p'
}

run_cluster() { # job steps nps nwk tag
  cluster "$3" "$4"
  start_all
  start_chief --job "$1" --steps "$2" --set eval_every_steps=0 \
    --logdir "$WORK/logs_$5" --summary-json "$WORK/s_$5.json"
  wait_chief 600
  for k in "${!PIDS[@]}"; do kill -9 "${PIDS[$k]}" 2>/dev/null; unset "PIDS[$k]"; done
  wait 2>/dev/null
  /usr/bin/python3 - "$WORK/s_$5.json" "$WORK/logs_$5/metrics.jsonl" <<'PY'
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

CTR="$TSR_SOURCE_DIR/deploy/jobs/ctr_wide_deep.json"
CSTEPS=${BENCH_CTR_STEPS:-200}
sa=$(standalone "$JOB" "$STEPS")
read -r c1 n1 <<<"$(run_cluster "$JOB" "$STEPS" 1 1 f1)"
read -r c2 n2 <<<"$(run_cluster "$JOB" "$STEPS" 2 2 f2)"
ca=$(standalone "$CTR" "$CSTEPS")
read -r r1 m1 <<<"$(run_cluster "$CTR" "$CSTEPS" 1 1 c1)"
read -r r2 m2 <<<"$(run_cluster "$CTR" "$CSTEPS" 2 2 c2)"
printf '\n%-40s %14s %18s\n' "run" "examples/s" "network wait share"
printf '%-40s %14s %18s\n' "Fashion-MNIST standalone" "$sa" "-"
printf '%-40s %14s %18s\n' "Fashion-MNIST 1 PS + 1 worker" "$c1" "$n1"
printf '%-40s %14s %18s\n' "Fashion-MNIST 2 PS + 2 workers" "$c2" "$n2"
printf '%-40s %14s %18s\n' "CTR wide-and-deep standalone" "$ca" "-"
printf '%-40s %14s %18s\n' "CTR wide-and-deep 1 PS + 1 worker" "$r1" "$m1"
printf '%-40s %14s %18s\n' "CTR wide-and-deep 2 PS + 2 workers" "$r2" "$m2"
/usr/bin/python3 - "$sa" "$c1" "$c2" "$ca" "$r1" "$r2" <<'PY'
import sys
sa, c1, c2, ca, r1, r2 = map(float, sys.argv[1:])
print(f"RATIO cluster_fmnist_1w_vs_standalone {c1 / sa:.2f} goal 0.5")
print(f"RATIO cluster_fmnist_2w_vs_standalone {c2 / sa:.2f} goal 0.5")
print(f"RATIO cluster_ctr_1w_vs_standalone {r1 / ca:.2f} goal 0.5")
print(f"RATIO cluster_ctr_2w_vs_standalone {r2 / ca:.2f} goal 0.5")
PY
[ -n "$c1" ] && [ -n "$c2" ] && [ -n "$sa" ] && [ -n "$r1" ] && [ -n "$r2" ] && [ -n "$ca" ]
