#!/usr/bin/env bash
# Builds Tessera's images on this machine:
#
#   deploy/docker/build.sh                 tessera:<version> (deploy/Dockerfile)
#   deploy/docker/build.sh --tensorboard   ... and tessera-tensorboard:2.20.0
#
# Happy path: an engine answers or engine.sh starts one (and stops it at
# the end), base-image.sh makes debian:12 when no registry gives it, then
# `docker build --network host` (the build reaches the package mirrors
# through the host's network, so the engine needs no NAT). The engine's
# data stays in $TSR_DOCKER_CACHE/engine: a second run reuses every layer
# and rebuilds only from the first changed source. Prints each image's size
# and how long each step took.
#
# Failure modes: any failed step stops the build with its status (the
# Dockerfiles hide no error); the engine this script started is stopped
# whatever happens.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$here/engine.sh"

tensorboard=0
for a in "$@"; do
  case "$a" in
    --tensorboard) tensorboard=1 ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument '$a'" >&2; exit 2 ;;
  esac
done

version=$(sed -n "s/^ *version *: *'\([^']*\)'.*/\1/p" "$root/meson.build" | head -n 1)
image=${TESSERA_IMAGE:-tessera:$version}
tb_image=${TESSERA_TENSORBOARD_IMAGE:-tessera-tensorboard:2.20.0}

tsr_docker_start
trap 'tsr_docker_stop' EXIT
trap 'exit 130' INT TERM

t0=$SECONDS
"$here/base-image.sh"
tsr_dk_say "base images ready in $((SECONDS - t0)) s"

export DOCKER_BUILDKIT=0   # the classic builder: no buildx plugin needed
build() { # image dockerfile
  local t=$SECONDS log="$TSR_DOCKER_CACHE/build-${2##*/}.log"
  tsr_dk_say "building $1 from $2 (log $log)"
  local ctx=${TSR_BUILD_ROOT:-$root}
  # shellcheck disable=SC2086
  if ! docker build --network host ${TSR_BUILD_ARGS:-} -f "$ctx/$2" -t "$1" "$ctx" \
       >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    tsr_dk_say "building $1 failed"
    return 1
  fi
  tsr_dk_say "$1: $(docker image inspect -f '{{.Size}}' "$1" |
    awk '{printf "%.0f MB", $1 / 1e6}') in $((SECONDS - t)) s"
}
build "$image" deploy/Dockerfile
if [ "$tensorboard" = 1 ]; then
  # From a context of its own: the TensorBoard Dockerfile, its pinned
  # requirements, and this machine's pip index and CA bundle (pip inside
  # the build must trust what pip here trusts).
  ctx=$(mktemp -d "${TMPDIR:-/tmp}/tsr-tb-ctx.XXXXXX")
  trap 'rm -rf "$ctx"; tsr_docker_stop' EXIT
  mkdir -p "$ctx/deploy/docker"
  cp "$root/deploy/Dockerfile.tensorboard" "$ctx/deploy/"
  cp "$root/deploy/docker/tensorboard-requirements.txt" "$ctx/deploy/docker/"
  pip_cert=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
  [ -n "$pip_cert" ] && [ -s "$pip_cert" ] && cp "$pip_cert" "$ctx/deploy/docker/pip-ca.crt"
  pip_index=${PIP_INDEX_URL:-$(pip3 config list 2>/dev/null |
    sed -n "s/^[a-z:]*\.index-url='\(.*\)'$/\1/p" | head -n 1)}
  TSR_BUILD_ROOT=$ctx TSR_BUILD_ARGS="--build-arg PIP_INDEX_URL=${pip_index:-https://pypi.org/simple}" \
    build "$tb_image" deploy/Dockerfile.tensorboard
fi
tsr_dk_say "done in $((SECONDS - t0)) s"
