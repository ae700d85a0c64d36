#!/usr/bin/env bash
# Examples per second of distributed training against standalone training
# of the same job measured in the same run, for the Fashion-MNIST MLP
# (784-256-128-10, batch 128) and the wide-and-deep CTR model
# (deploy/jobs/ctr_wide_deep.json: sparse embedding rows pulled and pushed
# by id): standalone (one process, one compute thread), then on a cluster
# of 1 PS + 1 worker and of 2 PS + 2 workers, all on this machine
# (loopback). Reports the share of a worker's step time spent waiting on
# the network (pull + push), and the CPU time every process of a run used
# per example (user + system, the chief and the PS included), so a machine
# shared with other work can still be read: a run with more threads gets
# more of a loaded machine's CPU, which the examples/s ratios then show as
# speed. With BENCH_VARIANTS=1 (default) the 2 PS + 2 workers Fashion-MNIST
# run is repeated with bfloat16 on the wire, with prefetch_params, and
# over loopback TCP (TESSERA_RPC_TRANSPORT=tcp) instead of the same-host
# Unix sockets every other run uses.
# Ends with RATIO lines, higher better. On a 2-core machine the cluster's
# processes share the cores the standalone run has to itself, so the 1w
# ratios measure the cost of the distribution, not a speed-up.
. "$TSR_SOURCE_DIR/tests/integration/cluster/lib.sh"
. "$TSR_SOURCE_DIR/tests/bench/cluster/bench_lib.sh"
STEPS=${BENCH_STEPS:-800}
JOB="$TSR_SOURCE_DIR/deploy/jobs/fashion_mnist.json"
VARIANTS=${BENCH_VARIANTS:-1}


CTR="$TSR_SOURCE_DIR/deploy/jobs/ctr_wide_deep.json"
CSTEPS=${BENCH_CTR_STEPS:-400}
Q=$((STEPS / 4)) CQ=$((CSTEPS / 4))
read -r sa sacpu saex <<<"$(standalone "$JOB" "$STEPS" 128)"
read -r _ sacpu0 saex0 <<<"$(standalone "$JOB" "$Q" 128)"
read -r c1 n1 c1cpu c1ex _ <<<"$(run_cluster "$JOB" "$STEPS" 1 1 f1)"
read -r _ _ c1cpu0 c1ex0 _ <<<"$(run_cluster "$JOB" "$Q" 1 1 f1q)"
read -r c2 n2 c2cpu c2ex _ <<<"$(run_cluster "$JOB" "$STEPS" 2 2 f2)"
read -r _ _ c2cpu0 c2ex0 _ <<<"$(run_cluster "$JOB" "$Q" 2 2 f2q)"
read -r ca cacpu caex <<<"$(standalone "$CTR" "$CSTEPS" 256)"
read -r _ cacpu0 caex0 <<<"$(standalone "$CTR" "$CQ" 256)"
read -r r1 m1 r1cpu r1ex _ <<<"$(run_cluster "$CTR" "$CSTEPS" 1 1 c1)"
read -r _ _ r1cpu0 r1ex0 _ <<<"$(run_cluster "$CTR" "$CQ" 1 1 c1q)"
read -r r2 m2 r2cpu r2ex _ <<<"$(run_cluster "$CTR" "$CSTEPS" 2 2 c2)"
read -r _ _ r2cpu0 r2ex0 _ <<<"$(run_cluster "$CTR" "$CQ" 2 2 c2q)"
if [ "$VARIANTS" = 1 ]; then
  read -r b2 nb2 b2cpu b2ex _ <<<"$(run_cluster "$JOB" "$STEPS" 2 2 fb \
    --set wire_precision=bf16)"
  read -r p2 np2 p2cpu p2ex _ <<<"$(run_cluster "$JOB" "$STEPS" 2 2 fp \
    --set prefetch_params=true)"
  read -r t2 nt2 t2cpu t2ex _ <<<"$(export TESSERA_RPC_TRANSPORT=tcp
    run_cluster "$JOB" "$STEPS" 2 2 ft)"
fi
psa=$(per "$saex" "$sacpu" "$saex0" "$sacpu0")
pc1=$(per "$c1ex" "$c1cpu" "$c1ex0" "$c1cpu0")
pc2=$(per "$c2ex" "$c2cpu" "$c2ex0" "$c2cpu0")
pca=$(per "$caex" "$cacpu" "$caex0" "$cacpu0")
pr1=$(per "$r1ex" "$r1cpu" "$r1ex0" "$r1cpu0")
pr2=$(per "$r2ex" "$r2cpu" "$r2ex0" "$r2cpu0")
row() { printf '%-44s %12s %14s %14s\n' "$@"; }
printf '\nstandalone: one process, one compute thread (OpenBLAS 1 thread)\n'
row "run" "examples/s" "network wait" "CPU us/example"
row "Fashion-MNIST standalone" "$sa" "-" "$psa"
row "Fashion-MNIST 1 PS + 1 worker" "$c1" "$n1" "$pc1"
row "Fashion-MNIST 2 PS + 2 workers" "$c2" "$n2" "$pc2"
if [ "$VARIANTS" = 1 ]; then
  # CPU against the fp32 run's short one: about the same fixed costs
  row "Fashion-MNIST 2 PS + 2 workers, bf16 wire" "$b2" "$nb2" \
    "$(per "$b2ex" "$b2cpu" "$c2ex0" "$c2cpu0")"
  row "Fashion-MNIST 2 PS + 2 workers, prefetch" "$p2" "$np2" \
    "$(per "$p2ex" "$p2cpu" "$c2ex0" "$c2cpu0")"
  row "Fashion-MNIST 2 PS + 2 workers, TCP only" "$t2" "$nt2" \
    "$(per "$t2ex" "$t2cpu" "$c2ex0" "$c2cpu0")"
fi
row "CTR wide-and-deep standalone" "$ca" "-" "$pca"
row "CTR wide-and-deep 1 PS + 1 worker" "$r1" "$m1" "$pr1"
row "CTR wide-and-deep 2 PS + 2 workers" "$r2" "$m2" "$pr2"
printf 'load average at the end: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/python3 - "$sa" "$c1" "$c2" "$ca" "$r1" "$r2" \
  "$psa" "$pc1" "$pc2" "$pca" "$pr1" "$pr2" <<'PY'
import sys
sa, c1, c2, ca, r1, r2, psa, pc1, pc2, pca, pr1, pr2 = map(float, sys.argv[1:])
print(f"RATIO cluster_fmnist_1w_vs_standalone {c1 / sa:.2f} goal 0.9")
print(f"RATIO cluster_fmnist_2w_vs_standalone {c2 / sa:.2f} goal 1.2")
print(f"RATIO cluster_ctr_1w_vs_standalone {r1 / ca:.2f} goal 0.8")
print(f"RATIO cluster_ctr_2w_vs_standalone {r2 / ca:.2f} goal 1.0")
# CPU per training example, standalone over cluster: the cost of the
# distribution whatever share of a loaded machine each run got.
print(f"RATIO cluster_fmnist_1w_cpu_vs_standalone {psa / pc1:.2f} goal 0.9")
print(f"RATIO cluster_fmnist_2w_cpu_vs_standalone {psa / pc2:.2f} goal 0.9")
print(f"RATIO cluster_ctr_1w_cpu_vs_standalone {pca / pr1:.2f} goal 0.8")
print(f"RATIO cluster_ctr_2w_cpu_vs_standalone {pca / pr2:.2f} goal 0.8")
PY
if [ "$VARIANTS" = 1 ] && [ -n "$t2" ]; then
  /usr/bin/python3 -c "import sys; print(f'RATIO cluster_fmnist_2w_unix_vs_tcp \
{float(sys.argv[1]) / float(sys.argv[2]):.2f} goal 1.0')" "$c2" "$t2"
fi
[ -n "$c1" ] && [ -n "$c2" ] && [ -n "$sa" ] && [ -n "$r1" ] && [ -n "$r2" ] && [ -n "$ca" ]
