#!/usr/bin/env bash
# The main job: a local cluster (2 PS, 2 workers, a chief on loopback)
# training an MLP on Fashion-MNIST (Debian's dataset-fashion-mnist), with a
# progress bar, TensorBoard logs and a final summary. Called by
# `deploy/setup.sh main` after the build; extra arguments go to
# `tessera local`.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
build=${1:-build}
shift || true
cd "$root"
tessera="$build/chief/tessera"
job="deploy/jobs/fashion_mnist.json"
logdir=${TSR_LOGDIR:-$root/out/fashion_mnist}

if ! "$tessera" local --help >/dev/null 2>&1 || [ ! -f "$job" ]; then
  cat >&2 <<MSG
[main] This build cannot run the main job yet.
[main] When the chief, worker loop and parameter server are all in place,
[main] this command runs:
[main]   $tessera local --ps 2 --workers 2 --job $job --logdir $logdir
[main] which trains an MLP (784-256-128-10) on Fashion-MNIST across 2 PS and
[main] 2 workers to a test accuracy of about 0.88, shows a progress bar, and
[main] writes TensorBoard logs to $logdir.
[main] Nothing was trained.
MSG
  exit 3
fi

mkdir -p "$logdir"
exec "$tessera" local --ps 2 --workers 2 --job "$job" --logdir "$logdir" "$@"
