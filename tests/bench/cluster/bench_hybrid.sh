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
# the same examples. Ends with RATIO lines, higher better, each the median
# of paired rounds (below). On a 2-core machine every cluster shares the
# cores the standalone run has to itself.
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

# Paired rounds (BENCH_ROUNDS, default 3): every round runs every
# configuration once, in the same order, and each RATIO is the median of
# its per-round ratios, so a slower stretch of a shared machine lands on
# both sides of a ratio instead of on one; the table shows each figure's
# median over the rounds.
ROUNDS=${BENCH_ROUNDS:-3}
FIGS=()
for ((round = 1; round <= ROUNDS; round++)); do
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
  for v in sa h1 h2 p2 ch cp nh np; do
    e=${v}_eps
    if [ -z "${!e}" ]; then
      echo "round $round: the $v run gave no figure (logs kept: KEEP_WORK=1)"
      exit 1
    fi
  done
  echo "round $round of $ROUNDS: examples/s $sa_eps $h1_eps $h2_eps $p2_eps $ch_eps $cp_eps $nh_eps $np_eps"
  FIGS+=("$sa_eps $h1_eps $h2_eps $p2_eps $ch_eps $cp_eps $nh_eps $np_eps"
         "$sa_cpu $h1_cpu $h2_cpu $p2_cpu $ch_cpu $cp_cpu $nh_cpu $np_cpu"
         "$h1_ar $h2_ar $ch_ar $nh_ar")
done
printf 'load average at the end: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/python3 - "$ROUNDS" "${FIGS[@]}" <<'PY'
import statistics, sys
rounds = int(sys.argv[1])
rows = [sys.argv[2 + 3 * i: 5 + 3 * i] for i in range(rounds)]
eps = [list(map(float, r[0].split())) for r in rows]
cpu = [list(map(float, r[1].split())) for r in rows]
ar = [list(map(float, r[2].split())) for r in rows]
med = lambda xs: statistics.median(xs)
col = lambda t, k: [r[k] for r in t]
names = ["Fashion-MNIST MLP standalone", "Fashion-MNIST MLP hybrid, 1 worker",
         "Fashion-MNIST MLP hybrid, 2 workers",
         "Fashion-MNIST MLP 2 PS + 2 workers async",
         "CTR wide-and-deep hybrid, 2 workers + 2 PS",
         "CTR wide-and-deep 2 PS + 2 workers async",
         "Fashion-MNIST CNN hybrid, 2 workers",
         "Fashion-MNIST CNN 2 PS + 2 workers async"]
arcol = {1: 0, 2: 1, 4: 2, 6: 3}
print(f"\nmedians of {rounds} round(s)")
print(f"{'run':44s} {'examples/s':>12s} {'all-reduce wait':>16s} {'CPU us/example':>15s}")
for k, n in enumerate(names):
    a = f"{med(col(ar, arcol[k])):.3f}" if k in arcol else "-"
    print(f"{n:44s} {med(col(eps, k)):12.1f} {a:>16s} {med(col(cpu, k)):15.1f}")
SA, H1, H2, P2, CH, CP, NH, NP = range(8)
def ratio(name, t, num, den, goal):
    per = [r[num] / r[den] for r in t]
    print(f"{name}: {rounds} paired round(s), per-round ratio min "
          f"{min(per):.2f} max {max(per):.2f}")
    print(f"RATIO {name} {med(per):.2f} goal {goal}")
ratio("hybrid_fmnist_1w_vs_standalone", eps, H1, SA, 0.95)
ratio("hybrid_fmnist_2w_vs_standalone", eps, H2, SA, 1.2)
ratio("hybrid_ctr_2w_vs_ps_async_2w", eps, CH, CP, 1.0)
ratio("hybrid_vs_ps_fmnist_mlp_2w", eps, H2, P2, 1.0)
ratio("hybrid_vs_ps_fmnist_cnn_2w", eps, NH, NP, 1.0)
# CPU per example, the other over hybrid: higher is hybrid cheaper
ratio("hybrid_fmnist_1w_cpu_vs_standalone", cpu, SA, H1, 0.95)
ratio("hybrid_fmnist_2w_cpu_vs_standalone", cpu, SA, H2, 0.9)
ratio("hybrid_ctr_2w_cpu_vs_ps_async_2w", cpu, CP, CH, 1.0)
ratio("hybrid_vs_ps_fmnist_mlp_2w_cpu", cpu, P2, H2, 1.0)
ratio("hybrid_vs_ps_fmnist_cnn_2w_cpu", cpu, NP, NH, 1.0)
PY
