#!/bin/sh
# Builds the libFuzzer targets with clang (ASan + UBSan) in BUILD_DIR and
# runs each for SECONDS (default 30), starting from the seeds in
# tests/fuzz/corpus/<target>/ plus what earlier runs found in
# BUILD_DIR/fuzz-corpus/<target>/. Exits non-zero on the first crash, leak
# or timeout (the reproducer is left in BUILD_DIR/fuzz-artifacts/).
# Needs Debian's clang and libclang-rt-14-dev.
set -eu
if [ $# -lt 1 ]; then
  echo "usage: $0 BUILD_DIR [SECONDS]" >&2
  exit 2
fi
build=$1
secs=${2:-30}
src=$(cd "$(dirname "$0")/../.." && pwd)
command -v clang >/dev/null || { echo "$0: clang not found (apt-get install clang libclang-rt-14-dev)" >&2; exit 2; }
# gcc-only warning flags elsewhere in the build must not stop clang
opts="-Dfuzz=true -Dgpu=disabled -Db_sanitize=address,undefined
      -Db_lundef=false"
# gcc-only attributes (optimize) must not stop clang either
cargs="-Dc_args=-Wno-unknown-warning-option -Wno-unknown-attributes"
log=$(mktemp)
if [ ! -f "$build/build.ninja" ]; then
  CC=clang meson setup "$build" "$src" $opts "$cargs" >"$log" 2>&1 ||
    { cat "$log" >&2; rm -f "$log"; exit 1; }
else
  meson configure "$build" $opts "$cargs" >"$log" 2>&1 ||
    { cat "$log" >&2; rm -f "$log"; exit 1; }
fi
rm -f "$log"
targets="fuzz_rpc_frame fuzz_rpc_handshake fuzz_ps_service fuzz_ckpt_shard fuzz_manifest fuzz_job fuzz_model fuzz_tfr_example"
for t in $targets; do
  if ! ninja -C "$build" -t targets all 2>/dev/null | grep -q "tests/fuzz/$t:"; then
    echo "$0: $build has no target $t: configure it with CC=clang and -Dfuzz=true" >&2
    exit 1
  fi
done
ninja -C "$build" $(for t in $targets; do printf 'tests/fuzz/%s ' "$t"; done)
mkdir -p "$build/fuzz-artifacts"
for t in $targets; do
  corpus="$build/fuzz-corpus/$t"
  mkdir -p "$corpus"
  echo "== $t for ${secs}s"
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ASAN_OPTIONS=detect_leaks=1 \
  "$build/tests/fuzz/$t" -max_total_time="$secs" -timeout=10 \
    -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="$build/fuzz-artifacts/$t-" \
    "$corpus" "$src/tests/fuzz/corpus/$t"
done
echo "fuzz: all targets ran ${secs}s without a failure"
