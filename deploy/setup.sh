#!/usr/bin/env bash
# Sets up a Debian 12 machine for Tessera and builds it. Idempotent: it
# installs only the Debian packages that are missing, configures the build
# folders once, and rebuilds what changed.
#
#   deploy/setup.sh            install what is missing, build (build/)
#   deploy/setup.sh main       ... then run the main job: a local cluster
#                              (2 PS, 2 workers, a chief) training an MLP on
#                              Fashion-MNIST, with a progress bar and summary
#   deploy/setup.sh test       ... then run every test: the suite in build/,
#                              the same suite under ASan+UBSan in
#                              build-asan/, and the fuzz targets with
#                              fixed seeds and run counts; the checks
#                              against Keras itself run in the first suite
#                              with TensorFlow's CPU wheel, tf_keras and
#                              Keras 3, which pip installs once into
#                              BUILD_DIR/keras-venv (deploy/keras-venv.sh;
#                              without the registry they skip, saying why)
#
# Environment: BUILD_DIR (default build), JOBS (ninja -j, default nproc),
# TSR_FUZZ_SCALE (multiplies the fixed fuzz run counts in `test`, default 1),
# TSR_KERAS_PYTHON (an interpreter with Keras to use instead of the venv).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
cd "$root"

mode=${1:-build}
case "$mode" in
  build|main|test) ;;
  -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
  *) echo "setup.sh: unknown mode '$mode' (build, main, test)" >&2; exit 2 ;;
esac
shift || true

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

say() { printf '[setup] %s\n' "$*"; }

# ---- Debian packages -------------------------------------------------------
pkgs=(meson ninja-build pkg-config gcc g++ libc6-dev
      libuv1-dev libprotobuf-c-dev protobuf-c-compiler libmsgpack-dev
      libcmocka-dev libopenblas-dev libdnnl-dev libjansson-dev libsodium-dev
      zlib1g-dev libpng-dev libjpeg62-turbo-dev libhdf5-dev libssl-dev
      dataset-fashion-mnist)
if [ "$mode" = test ]; then
  # libFuzzer targets, network-namespace tests; the deployment tests: a
  # Docker engine and compose, debootstrap for a local debian:12 base,
  # a virtual environment for the Kubernetes validators, Slurm and munge
  # for a one-node Slurm of deploy_slurm's own; the model checker and the
  # stress gate's CPU load
  pkgs+=(clang libclang-rt-14-dev iproute2 iptables procps python3 python3-numpy
        python3-msgpack python3-h5py spin stress-ng
        docker-compose docker.io debootstrap python3-venv python3-yaml
        slurm-wlm munge)
fi

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing missing Debian packages: ${missing[*]}"
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo=sudo; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  say "all Debian packages present"
fi

# ---- build -----------------------------------------------------------------
# CUDA parts compile when nvcc is present (/usr/local/cuda); the binaries
# fall back to the CPU at run time when there is no GPU.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

configure() { # dir, extra meson args...
  local dir=$1; shift
  if [ ! -f "$dir/build.ninja" ]; then
    say "configuring $dir"
    meson setup "$dir" "$@" >/dev/null
  fi
}

configure "$BUILD_DIR" --buildtype=debugoptimized
say "building $BUILD_DIR"
ninja -C "$BUILD_DIR" -j "$JOBS" >/dev/null

case "$mode" in
  build)
    say "built: $BUILD_DIR/chief/tessera, $BUILD_DIR/ps/tessera-ps, $BUILD_DIR/worker/tessera-worker, $BUILD_DIR/chief/tessera-chief"
    ;;
  main)
    exec "$here/run-main.sh" "$BUILD_DIR" "$@"
    ;;
  test)
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
    # Keras for the checks against Keras itself (keras_compare,
    # keras_evaluate, the Keras part of the export tests), in the main
    # suite: under ASan they would check again the code the suite's own
    # ASan tests cover, at about two minutes more
    if [ -n "${TSR_KERAS_PYTHON:-}" ]; then
      say "Keras checks with TSR_KERAS_PYTHON=$TSR_KERAS_PYTHON"
    elif "$here/keras-venv.sh" "$BUILD_DIR"; then
      TSR_KERAS_PYTHON=$(cd "$BUILD_DIR" && pwd)/keras-venv/bin/python
      export TSR_KERAS_PYTHON
    else
      TSR_KERAS_WHY=$(head -1 "$BUILD_DIR/keras-venv.skip" 2>/dev/null ||
                      echo "deploy/keras-venv.sh $BUILD_DIR failed")
      export TSR_KERAS_WHY
      say "the checks against Keras will skip: $TSR_KERAS_WHY"
    fi
    say "test suite ($BUILD_DIR)"
    meson test -C "$BUILD_DIR" --num-processes "$JOBS" --print-errorlogs "$@"
    configure build-asan -Db_sanitize=address,undefined -Db_lundef=false \
      -Dgpu=disabled --buildtype=debugoptimized
    say "building build-asan (ASan + UBSan)"
    ninja -C build-asan -j "$JOBS" >/dev/null
    say "test suite under ASan + UBSan (build-asan)"
    TSR_KERAS_WHY="the checks against Keras run in the main suite ($BUILD_DIR), not under ASan" \
    env -u TSR_KERAS_PYTHON \
    meson test -C build-asan --num-processes "$JOBS" --print-errorlogs \
      --timeout-multiplier 3 "$@"
    if [ -x tests/fuzz/run.sh ]; then
      # fixed seeds and run counts over the checked-in corpus: the same
      # tree fuzzes the same inputs everywhere; open-ended fuzzing is
      # tests/fuzz/run.sh BUILD_DIR SECONDS, whose finds become corpus entries
      say "fuzzing (fixed seeds and runs)"
      tests/fuzz/run.sh --fixed build-fuzz
    fi
    # one closing line over both runs, read from meson's JSON logs
    /usr/bin/python3 - "$BUILD_DIR" build-asan <<'PY'
import json, sys
ok = bad = 0
for d in sys.argv[1:]:
    for line in open(f"{d}/meson-logs/testlog.json"):
        r = json.loads(line).get("result")
        if r in ("OK", "EXPECTEDFAIL"):
            ok += 1
        elif r != "SKIP":
            bad += 1
print(f"tests: {ok} passed, {bad} failed")
PY
    say "all tests passed"
    ;;
esac
