#!/usr/bin/env bash
# Hybrid training (dense "allreduce": dense variables on the workers'
# ring, tables on the PS) against standalone training and against the
# parameter-server mode, same run, same machine (loopback):
#   Fashion-MNIST MLP (784-256-128-10, batch 128): standalone, hybrid on
#     1 and 2 workers (no PS: no table), 2 PS + 2 workers async;
#   CTR wide-and-deep (deploy/jobs/ctr_wide_deep.json): hybrid on 2
#     workers with the tables on 2 PS, against 2 PS + 2 workers async;
#   the Fashion-MNIST CNN (deploy/jobs/fashion_mnist_cnn.json): hybrid on
#     2 workers against 2 PS + 2 workers async.
# Examples per second from each run's summary (training time only), and
# CPU microseconds per example over every process of a run. A hybrid
# global step is a step of every worker (the global batch is workers x
# batch_size), so the 2-worker hybrid runs train half the global steps for
# the same examples. Ends with RATIO lines, higher better. On a 2-core
# machine every cluster shares the cores the standalone run has to itself.
. "$TSR_SOURCE_DIR/tests/integration/cluster/lib.sh"
STEPS=${BENCH_STEPS:-800}
CSTEPS=${BENCH_CTR_STEPS:-400}
NSTEPS=${BENCH_CNN_STEPS:-200}
FM="$TSR_SOURCE_DIR/deploy/jobs/fashion_mnist.json"
CTR="$TSR_SOURCE_DIR/deploy/jobs/ctr_wide_deep.json"
CNN="$TSR_SOURCE_DIR/deploy/jobs/fashion_mnist_cnn.json"
if [ ! -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "Fashion-MNIST is not installed (deploy/setup.sh installs dataset-fashion-mnist)"
  exit 1
fi
HY=(--set 'dense="allreduce"')
. "$TSR_SOURCE_DIR/tests/bench/cluster/bench_lib.sh"

# Each figure also as CPU microseconds per example (bench_lib.sh's per: a
# run less a quarter-length run of it), which a loaded machine leaves
# readable: examples/s ratios there say more about which run got the CPU.
fig() { # var-prefix job steps nps nwk tag [chief args]: sets ${1}_eps,
        # ${1}_ar, ${1}_cpu
  local p=$1 job=$2 steps=$3 nps=$4 nwk=$5 tag=$6 eps ar cpu ex cpu0 ex0
  shift 6
  read -r eps _ cpu ex ar <<<"$(run_cluster "$job" "$steps" "$nps" "$nwk" "$tag" "$@")"
  read -r _ _ cpu0 ex0 _ <<<"$(run_cluster "$job" $((steps / 4)) "$nps" "$nwk" "${tag}q" "$@")"
  printf -v "${p}_eps" '%s' "$eps"
  printf -v "${p}_ar" '%s' "$ar"
  printf -v "${p}_cpu" '%s' "$(per "$ex" "$cpu" "$ex0" "$cpu0")"
}

read -r sa_eps sacpu saex <<<"$(standalone "$FM" "$STEPS" 128)"
read -r _ sacpu0 saex0 <<<"$(standalone "$FM" $((STEPS / 4)) 128)"
sa_cpu=$(per "$saex" "$sacpu" "$saex0" "$sacpu0")
fig h1 "$FM" "$STEPS" 0 1 fh1 "${HY[@]}"
fig h2 "$FM" $((STEPS / 2)) 0 2 fh2 "${HY[@]}"
fig p2 "$FM" "$STEPS" 2 2 fp2
fig ch "$CTR" $((CSTEPS / 2)) 2 2 ch2 "${HY[@]}"
fig cp "$CTR" "$CSTEPS" 2 2 cp2
fig nh "$CNN" $((NSTEPS / 2)) 0 2 nh2 "${HY[@]}"
fig np "$CNN" "$NSTEPS" 2 2 np2
row() { printf '%-44s %12s %16s %15s\n' "$@"; }
printf '\n'
row "run" "examples/s" "all-reduce wait" "CPU us/example"
row "Fashion-MNIST MLP standalone" "$sa_eps" "-" "$sa_cpu"
row "Fashion-MNIST MLP hybrid, 1 worker" "$h1_eps" "$h1_ar" "$h1_cpu"
row "Fashion-MNIST MLP hybrid, 2 workers" "$h2_eps" "$h2_ar" "$h2_cpu"
row "Fashion-MNIST MLP 2 PS + 2 workers async" "$p2_eps" "-" "$p2_cpu"
row "CTR wide-and-deep hybrid, 2 workers + 2 PS" "$ch_eps" "$ch_ar" "$ch_cpu"
row "CTR wide-and-deep 2 PS + 2 workers async" "$cp_eps" "-" "$cp_cpu"
row "Fashion-MNIST CNN hybrid, 2 workers" "$nh_eps" "$nh_ar" "$nh_cpu"
row "Fashion-MNIST CNN 2 PS + 2 workers async" "$np_eps" "-" "$np_cpu"
printf 'load average at the end: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/python3 - "$sa_eps" "$h1_eps" "$h2_eps" "$p2_eps" "$ch_eps" "$cp_eps" \
  "$nh_eps" "$np_eps" "$sa_cpu" "$h1_cpu" "$h2_cpu" "$p2_cpu" "$ch_cpu" \
  "$cp_cpu" "$nh_cpu" "$np_cpu" <<'PY'
import sys
sa, h1, h2, p2, ch, cp, nh, np_ = map(float, sys.argv[1:9])
csa, ch1, ch2, cp2, cch, ccp, cnh, cnp = map(float, sys.argv[9:17])
print(f"RATIO hybrid_fmnist_1w_vs_standalone {h1 / sa:.2f} goal 0.95")
print(f"RATIO hybrid_fmnist_2w_vs_standalone {h2 / sa:.2f} goal 1.2")
print(f"RATIO hybrid_ctr_2w_vs_ps_async_2w {ch / cp:.2f} goal 1.0")
print(f"RATIO hybrid_vs_ps_fmnist_mlp_2w {h2 / p2:.2f} goal 1.0")
print(f"RATIO hybrid_vs_ps_fmnist_cnn_2w {nh / np_:.2f} goal 1.0")
# CPU per example, the other over hybrid: higher is hybrid cheaper
print(f"RATIO hybrid_fmnist_1w_cpu_vs_standalone {csa / ch1:.2f} goal 0.95")
print(f"RATIO hybrid_fmnist_2w_cpu_vs_standalone {csa / ch2:.2f} goal 0.9")
print(f"RATIO hybrid_ctr_2w_cpu_vs_ps_async_2w {ccp / cch:.2f} goal 1.0")
print(f"RATIO hybrid_vs_ps_fmnist_mlp_2w_cpu {cp2 / ch2:.2f} goal 1.0")
print(f"RATIO hybrid_vs_ps_fmnist_cnn_2w_cpu {cnp / cnh:.2f} goal 1.0")
PY
[ -n "$sa_eps" ] && [ -n "$h1_eps" ] && [ -n "$h2_eps" ] && [ -n "$ch_eps" ] && [ -n "$nh_eps" ]
