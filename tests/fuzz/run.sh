#!/bin/sh
# Builds the libFuzzer targets with clang (ASan + UBSan) in BUILD_DIR and
# fuzzes them. Two ways:
#
#   run.sh BUILD_DIR [SECONDS]   open-ended: each target for SECONDS
#                                (default 30) from a random seed, starting
#                                from tests/fuzz/corpus/<target>/ plus what
#                                earlier runs kept in BUILD_DIR/fuzz-corpus/.
#                                A find is left in BUILD_DIR/fuzz-artifacts/:
#                                fix it and add the input to the corpus as
#                                tests/fuzz/corpus/<target>/regress-<what>.
#   run.sh --fixed BUILD_DIR     what the test command runs: every target
#                                with a fixed seed and a fixed number of
#                                runs (RUNS below, times TSR_FUZZ_SCALE,
#                                default 1) over the checked-in corpus
#                                alone, so the same tree gives the same
#                                inputs on every machine; the regression
#                                inputs of the corpus run first.
#
# Exits non-zero on the first crash, leak or timeout (the reproducer is
# left in BUILD_DIR/fuzz-artifacts/). Needs Debian's clang and
# libclang-rt-14-dev.
set -eu
fixed=0
if [ "${1:-}" = --fixed ]; then
  fixed=1
  shift
fi
if [ $# -lt 1 ]; then
  echo "usage: $0 BUILD_DIR [SECONDS] | $0 --fixed BUILD_DIR" >&2
  exit 2
fi
build=$1
secs=${2:-30}
scale=${TSR_FUZZ_SCALE:-1}
case "$scale" in
  ''|*[!0-9]*) echo "$0: TSR_FUZZ_SCALE must be a whole number, not '$scale'" >&2; exit 2 ;;
esac
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
# a target added since the folder was configured appears only once ninja
# has regenerated its build file
ninja -C "$build" build.ninja >/dev/null
targets="fuzz_rpc_frame fuzz_rpc_handshake fuzz_ps_service fuzz_ckpt_shard fuzz_manifest fuzz_job fuzz_model fuzz_tfr_example"
for t in $targets; do
  if ! ninja -C "$build" -t targets all 2>/dev/null | grep -q "tests/fuzz/$t:"; then
    echo "$0: $build has no target $t: configure it with CC=clang and -Dfuzz=true" >&2
    exit 1
  fi
done
ninja -C "$build" $(for t in $targets; do printf 'tests/fuzz/%s ' "$t"; done)
mkdir -p "$build/fuzz-artifacts"
# Runs per target in --fixed mode: about 60 s in all on a 2-core machine.
runs_of() {
  case "$1" in
    fuzz_rpc_frame|fuzz_rpc_handshake) echo 100000 ;;
    fuzz_ps_service) echo 10000 ;;
    fuzz_manifest) echo 20000 ;;
    fuzz_model) echo 40000 ;;
    fuzz_tfr_example) echo 60000 ;;
    *) echo 30000 ;;
  esac
}
for t in $targets; do
  if [ "$fixed" = 1 ]; then
    # new inputs go to a scratch folder, never into the source tree or a
    # folder a later run would start from
    scratch=$(mktemp -d)
    runs=$(( $(runs_of "$t") * scale ))
    echo "== $t: $runs runs, seed 1"
    rc=0
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    ASAN_OPTIONS=detect_leaks=1 \
    "$build/tests/fuzz/$t" -seed=1 -runs="$runs" -timeout=10 \
      -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
      -artifact_prefix="$build/fuzz-artifacts/$t-" \
      "$scratch" "$src/tests/fuzz/corpus/$t" || rc=$?
    rm -rf "$scratch"
    [ "$rc" = 0 ] || exit "$rc"
    continue
  fi
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
if [ "$fixed" = 1 ]; then
  echo "fuzz: all targets ran their fixed runs without a failure"
else
  echo "fuzz: all targets ran ${secs}s without a failure"
fi
