#!/bin/bash
# Accuracy parity with Keras: each job trained seed by seed by Keras itself
# (keras_reference.py, under the Keras interpreter of tests/keras_python.sh:
# $TSR_KERAS_PYTHON, else the build folder's Keras venv) and by Tessera's
# standalone trainer on one thread, same files, model, optimizer, batch and
# epochs.
# Prints each seed's eval metric on both sides, the ranges, and
#   RATIO keras_parity_<job> <tessera mean / keras mean> goal 0.99
# for accuracy (keras mean / tessera mean for a loss such as mse, so higher
# is better either way).
#
#   bench_keras_parity.sh WORKER_EXE [JOB.json ...]   (env SEEDS="1 2 3")
#
# Defaults: the digits BatchNormalization CNN and the Functional diabetes
# model (a few minutes); the Fashion-MNIST CNN takes about ten minutes a
# seed on one core per side: name it to include it. Exits 77 when the
# interpreter has no Keras. Each side's mean comes with its standard error
# and the ratio with its own: the Functional model's test MSE after 500
# epochs spreads by 3-4% from seed to seed on both sides, so five seeds
# leave the ratio a standard error of about 2% (five-seed blocks of seeds
# 1-20 gave 0.977, 1.004, 1.029, 0.981; all twenty 0.998); judge its 0.99
# with SEEDS="$(seq 1 20)" or more.
set -u
WORKER=$1; shift
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
. "$ROOT/tests/keras_python.sh"   # KPY, KPY_WHY
PY=$KPY
SEEDS=${SEEDS:-"1 2 3 4 5"}
JOBS=("$@")
[ ${#JOBS[@]} -gt 0 ] || JOBS=("$ROOT/deploy/jobs/digits_cnn_bn.json"
                              "$ROOT/deploy/jobs/diabetes_functional.json")
"$PY" -c 'import tf_keras' 2>/dev/null || "$PY" -c 'import keras' 2>/dev/null \
  || { echo "SKIP: no Keras in $PY${KPY_WHY:+: $KPY_WHY}"; exit 77; }
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT

for job in "${JOBS[@]}"; do
  name=$(basename "$job" .json)
  metric=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); m=j.get("metrics") or ["loss"]; print("loss" if j["loss"] in ("mse","mae") else m[0])' "$job")
  echo "== $name ($metric on the eval split; seeds $SEEDS)"
  "$PY" "$HERE/keras_reference.py" "$job" $SEEDS 2>"$TMP/k.err" >"$TMP/k.out" \
    || { cat "$TMP/k.err" >&2; exit 1; }
  : >"$TMP/t.out"
  for s in $SEEDS; do
    "$WORKER" --standalone --job "$job" --seed "$s" --threads 1 \
      --summary-json "$TMP/t$s.json" >"$TMP/t$s.log" 2>&1 \
      || { tail -5 "$TMP/t$s.log" >&2; exit 1; }
    python3 -c 'import json,sys; print(sys.argv[2], json.load(open(sys.argv[1]))["eval"][sys.argv[3]])' \
      "$TMP/t$s.json" "$s" "$metric" >>"$TMP/t.out"
  done
  python3 - "$TMP/k.out" "$TMP/t.out" "$name" "$metric" <<'PY'
import sys
kv = {}
for line in open(sys.argv[1]):
    f = line.split()
    if f and f[0] == "SEED":
        kv[int(f[1])] = float(f[5]) if sys.argv[4] == "loss" else float(f[3])
tv = {int(a): float(b) for a, b in (l.split() for l in open(sys.argv[2]))}
for s in sorted(kv):
    print(f"seed {s}: keras {kv[s]:.4f}  tessera {tv[s]:.4f}")
k, t = list(kv.values()), list(tv.values())
km, tm = sum(k) / len(k), sum(t) / len(t)


def se(v, m):  # standard error of the mean over the seeds
    return (sum((x - m) ** 2 for x in v) / (len(v) - 1) / len(v)) ** 0.5 \
        if len(v) > 1 else float("nan")


ks, ts = se(k, km), se(t, tm)
print(f"keras   {min(k):.4f}-{max(k):.4f} mean {km:.4f} +- {ks:.4f}")
print(f"tessera {min(t):.4f}-{max(t):.4f} mean {tm:.4f} +- {ts:.4f}")
ratio = km / tm if sys.argv[4] == "loss" else tm / km
# the ratio's standard error from the two spreads: a goal closer to 1 than
# about twice this needs more seeds to be judged (SEEDS="$(seq 1 20)")
rse = ratio * ((ks / km) ** 2 + (ts / tm) ** 2) ** 0.5
print(f"ratio {ratio:.3f} +- {rse:.3f} (standard error from the seed spread)")
print(f"RATIO keras_parity_{sys.argv[3]} {ratio:.3f} goal 0.99")
PY
done
