#!/usr/bin/env bash
# Helpers of the cluster benchmarks (bench_cluster.sh, bench_hybrid.sh),
# sourced after tests/integration/cluster/lib.sh: standalone runs and the
# CPU time of the runs, so a machine shared with other work can still be
# read (a run with more processes gets more of a loaded machine's CPU,
# which examples/s ratios then show as speed).

# The CPU seconds (user + sys) of this shell's children so far: `times`
# runs in this shell (a command substitution would be a new one, without
# children), into a file.
cpu_of_children() { # file
  times >"$1"
  sed -n 2p "$1" | awk '{
    split($1, u, "m"); split($2, s, "m");
    printf "%.3f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }'
}

standalone() { # job steps batch -> "examples/s cpu_s examples"
  (
    out=$("$WK_BIN" --standalone --job "$1" --device cpu --steps "$2" \
          2>/dev/null | sed -n 's/^final:.* \([0-9.]*\) examples\/s.*/\1/p')
    cpu_of_children "$WORK/times_sa" >"$WORK/cpu_sa"
    echo "$out $(cat "$WORK/cpu_sa") $(($2 * $3))"
  )
}

# CPU microseconds per training example: the difference of a run and a
# run of a quarter of its steps, so loading the data, starting up and the
# final evaluation (the same in both) cancel out.
per() { # examples cpu_s short_examples short_cpu_s
  /usr/bin/python3 -c "import sys; e, c, e0, c0 = map(float, sys.argv[1:5]); \
print(f'{1e6 * (c - c0) / (e - e0):.1f}' if e > e0 else 'nan')" "$@"
}


# A cluster run of `steps` global steps -> "examples/s network_wait_share
# cpu_s examples allreduce_wait_share" (shares: the workers' mean; nan
# where the run has none).
run_cluster() { # job steps nps nwk tag [chief args]
  local job=$1 steps=$2 nps=$3 nwk=$4 tag=$5
  shift 5
  cluster "$nps" "$nwk"
  start_all
  start_chief --job "$job" --steps "$steps" --set eval_every_steps=0 \
    --logdir "$WORK/logs_$tag" --summary-json "$WORK/s_$tag.json" "$@"
  wait_chief 600
  for k in "${!PIDS[@]}"; do kill -9 "${PIDS[$k]}" 2>/dev/null; unset "PIDS[$k]"; done
  wait 2>/dev/null
  local cpu
  cpu_of_children "$WORK/times_$tag" >"$WORK/cpu_$tag"
  cpu=$(cat "$WORK/cpu_$tag")
  /usr/bin/python3 - "$WORK/s_$tag.json" "$WORK/logs_$tag/metrics.jsonl" "$cpu" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
net, ar = {}, {}
for line in open(sys.argv[2]):
    r = json.loads(line)
    t = r.get("tag", "")
    if t.endswith("network_wait_share"):
        net[t] = r["value"]
    if t.endswith("allreduce_wait_share"):
        ar[t] = r["value"]
mean = lambda d: sum(d.values()) / len(d) if d else float("nan")
print(f'{s["examples_per_sec"]:.1f} {mean(net):.3f} {sys.argv[3]} '
      f'{s["examples"]} {mean(ar):.3f}')
PY
}
