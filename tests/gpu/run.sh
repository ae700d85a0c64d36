#!/bin/sh
# tests/gpu/run.sh: the GPU checks of the compute module, in one go, on a
# machine with an NVIDIA GPU (sm_80 or sm_90; written for an H200).
#
#   1. build with -Dgpu=enabled (nvcc: sm_80 + sm_90) in $BUILD (build-gpu),
#      gpu_check included (a meson target, tests/gpu/meson.build)
#   2. unit tests of kernels and models on that build (the module loads;
#      the shared formulas, the GEMM mapping and gpu_check's CPU self-test)
#   3. gpu_check: every GPU kernel and a full training step (MLP, wide_deep,
#      a CNN with BatchNormalization, a Functional residual block;
#      fp32, bf16, fp16) against the CPU backend, NCCL replicas when there
#      are several GPUs, NCCL among processes (kernels/kern_nccl.h, what
#      dense "allreduce" uses on GPU workers: a communicator of one rank,
#      two rank processes with two GPUs), then the GPU benchmark (MLP 784-1024-1024-10 at
#      batch 256, and 8192-wide layers at batch 4096 in bf16, each against
#      its own products through cuBLAS in the same run)
#   4. the CPU benchmark of the same step, and standalone training on the
#      GPU (diabetes, Fashion-MNIST when installed) for the quality figures
#
# Machines without the build dependencies (libuv, jansson, ... , meson):
# make a bundle on a build machine with `tests/gpu/run.sh --bundle DIR`
# (binaries, the CUDA module and the non-system shared libraries they
# need), carry DIR, and run `tests/gpu/run.sh --from DIR` on the GPU
# machine. Output: a log and a summary under $OUT (default $BUILD/gpu-out).
# Exit status: 0 when every check passed.
set -u
cd "$(dirname "$0")/../.." || exit 2
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-$BUILD/gpu-out}
MODE=build
DIR=
case "${1:-}" in
  --bundle) MODE=bundle; DIR=${2:?--bundle DIR}; OUT=$DIR ;;
  --from) MODE=from; DIR=${2:?--from DIR} ;;
  "") ;;
  *) echo "usage: $0 [--bundle DIR | --from DIR]" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
LOG=$OUT/gpu-run.log
: > "$LOG"
say() { echo "$*" | tee -a "$LOG"; }
# runs a command, its output into the log too; returns its status
run() {
  say "+ $*"
  { "$@" 2>&1; echo $? > "$OUT/.rc"; } | tee -a "$LOG"
  return "$(cat "$OUT/.rc")"
}
fails=0

deps_ok() {
  for t in meson ninja pkg-config protoc-c nvcc; do
    command -v $t >/dev/null 2>&1 || [ "$t" = nvcc -a -x /usr/local/cuda/bin/nvcc ] ||
      { say "missing tool: $t"; return 1; }
  done
  for p in libuv jansson libsodium libprotobuf-c zlib openblas cmocka; do
    pkg-config --exists $p || { say "missing library: $p"; return 1; }
  done
  return 0
}

build() {
  export PATH="$PATH:/usr/local/cuda/bin"
  if [ ! -f "$BUILD/build.ninja" ]; then
    run meson setup "$BUILD" -Dgpu=enabled -Dbuildtype=release || return 1
  fi
  run ninja -C "$BUILD" ${JOBS:+-j$JOBS} kernels/cuda/libtsr_kern_cuda.so \
      worker/tessera-worker tests/gpu/gpu_check \
      tests/bench/kernels/bench_kern_step tests/unit/kernels/test_kern \
      tests/unit/kernels/test_kern_math tests/unit/kernels/test_kern_plan \
      tests/unit/worker/test_model tests/unit/worker/test_standalone ||
    return 1
  [ -f "$BUILD/kernels/cuda/libtsr_kern_cuda.so" ] ||
    { say "the CUDA module was not built"; return 1; }
}

if [ "$MODE" = bundle ]; then
  deps_ok && build || exit 1
  mkdir -p "$DIR/lib"
  cp "$BUILD/tests/gpu/gpu_check" "$BUILD/worker/tessera-worker" \
     "$BUILD/tests/bench/kernels/bench_kern_step" "$DIR/"
  cp "$BUILD/kernels/cuda/libtsr_kern_cuda.so" "$DIR/"
  for b in "$DIR/gpu_check" "$DIR/tessera-worker" "$DIR/bench_kern_step"; do
    ldd "$b" | awk '$3 ~ /^\// {print $3}' | while read -r l; do
      case "$(basename "$l")" in
        libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*) ;;
        *) cp -L "$l" "$DIR/lib/" ;;
      esac
    done
  done
  du -sh "$DIR"
  exit 0
fi

if [ "$MODE" = from ]; then
  GPU_CHECK=$DIR/gpu_check
  export LD_LIBRARY_PATH="$DIR/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export TESSERA_MODULE_DIR="$DIR"
  WORKER=$DIR/tessera-worker
  BENCH=$DIR/bench_kern_step
else
  if ! deps_ok; then
    say "build dependencies missing here: make a bundle elsewhere with"
    say "  tests/gpu/run.sh --bundle DIR   and run   tests/gpu/run.sh --from DIR"
    exit 2
  fi
  build || { say "BUILD FAILED"; exit 1; }
  GPU_CHECK=$BUILD/tests/gpu/gpu_check
  WORKER=$BUILD/worker/tessera-worker
  BENCH=$BUILD/tests/bench/kernels/bench_kern_step
  run meson test -C "$BUILD" --no-rebuild kern kern_math kern_plan \
      gpu_check_cpu model standalone ||
    fails=$((fails + 1))
fi

# the CUDA libraries the module needs: /usr/local/cuda, else wherever the
# image keeps them (e.g. the nvidia-* Python wheels)
for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  [ -e "/usr/local/cuda/lib64/$lib" ] && continue
  ldconfig -p 2>/dev/null | grep -q "$lib" && continue
  f=$(find / -xdev -name "$lib" -not -path '/proc/*' 2>/dev/null | head -n 1)
  [ -n "$f" ] && export LD_LIBRARY_PATH="$(dirname "$f")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" &&
    say "using $f"
done
run nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
# 3. kernels and steps against the CPU, then the GPU benchmark
run "$GPU_CHECK" || fails=$((fails + 1))
# 4. CPU benchmark and standalone training on the GPU
run "$BENCH" 20 || fails=$((fails + 1))
run "$WORKER" --standalone --job deploy/jobs/diabetes.json --device gpu ||
  fails=$((fails + 1))
grep -q "cuda x" "$LOG" || { say "standalone did not run on the GPU"; fails=$((fails + 1)); }
if [ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  for p in fp32 bf16 fp16; do
    run "$WORKER" --standalone --job deploy/jobs/fashion_mnist.json \
        --device gpu --precision $p || fails=$((fails + 1))
  done
fi
say "---- summary"
grep -E "^RATIO|FAIL|final:|failure|TFLOP" "$LOG" | tee "$OUT/summary.txt"
say "run.sh: $fails failed stage(s)"
[ "$fails" -eq 0 ]
