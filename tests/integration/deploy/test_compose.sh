#!/usr/bin/env bash
# deploy/docker-compose.yml for real, on a Docker engine of this machine,
# under docker-compose and as a Docker Swarm stack. Its images take 18
# minutes to build on a machine that has none (26 for the whole test), 10
# after a source change: more than the suite's budget, so it runs when
# asked (TSR_DOCKER_TESTS=1 meson test -C build deploy_compose) and is
# skipped (77) otherwise.
#  - the engine: one that answers, or a private dockerd that
#    deploy/docker/engine.sh starts (and stops by its pid at the end); no
#    engine can start at all: exit 77 (skipped), never a pass;
#  - the images, by deploy/docker/build.sh (debian:12 from debootstrap when
#    no registry answers; the engine's data is kept in $TSR_BUILD_DIR/docker,
#    so a second run reuses the base tarball and every layer): the build
#    context holds no token, .git or build folders; the image runs as uid
#    10001 with no home, and /data is 10001's;
#  - a token file uid 10001 cannot read: the chief stops with a message that
#    says so, exit 2, after 5 restarts (not for ever);
#  - `docker-compose up` of the Fashion-MNIST job: the chief exits 0 after
#    3760 steps with test accuracy >= 0.86 (the bound of the main-job test,
#    under the spread of honest runs); the volume holds periodic
#    checkpoints, the final one, the TensorBoard event file and no dotfiles;
#    every other service exits 0; each PS's container has its 2 GiB limit
#    (deploy.resources) and its shards stay under /data/checkpoints;
#    TensorBoard (deploy/docker-compose.tensorboard.yml) serves the run's
#    scalars on 127.0.0.1 only; meanwhile network namespaces joined by a
#    bridge (as the netns tests build them) still talk;
#  - crashes, each on a fresh run, each ending with the exact step count:
#    kill -9 of a worker's process, of a PS's and of the chief's (the
#    restart policy brings each back), and `docker kill` of a PS followed by
#    `docker-compose up -d` of it (Docker does not restart a killed
#    container: the operator's step the README gives);
#  - the same file as a Swarm stack (stack.sh, which deploy_stack runs in
#    the suite on an image of the build's binaries), when the engine can
#    make a swarm of its own (one it does not belong to already; else said
#    and left out):
#    `docker stack deploy` trains to the same accuracy, every task ends
#    Complete; then a run with kill -9 of a PS's process, `docker kill` of
#    a worker's container and kill -9 of the chief's process, each once a
#    newer checkpoint is committed: the swarm replaces each task, exact
#    step count, the PS restored and the chief resumed from the newest
#    checkpoint; the swarm is left and its gateway bridge removed;
#  - after the engine stops, the host's bridge netfilter, forwarding and
#    iptables settings, and Docker's bridges, are as they were.
# Prints the time each part took (TIME lines).
set -u
if [ -z "${TSR_DOCKER_TESTS:-}" ]; then
  echo "SKIP: deploy_compose builds images (18 minutes from nothing) and runs"
  echo "      the compose cluster and a Swarm stack for 10 minutes more: run it with"
  echo "      TSR_DOCKER_TESTS=1 meson test -C build deploy_compose"
  exit 77
fi
SRC=${TSR_SOURCE_DIR:?TSR_SOURCE_DIR not set}
BUILD=${TSR_BUILD_DIR:?TSR_BUILD_DIR not set}
PORTS_BIN=$BUILD/tests/ports/tsr-test-ports
export TSR_DOCKER_CACHE=${TSR_DOCKER_CACHE:-$BUILD/docker}
. "$SRC/deploy/docker/engine.sh"
. "$SRC/tests/integration/netns/netns.sh"
export DOCKER_BUILDKIT=0
unset TESSERA_LOG   # the containers' level comes from the compose file

FILE="$SRC/deploy/docker-compose.yml"
TBFILE="$SRC/deploy/docker-compose.tensorboard.yml"
P="tsrcompose$$"
WORK=$(mktemp -d /tmp/tsr_compose_XXXXXX)
JOB_STEPS=3760   # deploy/jobs/fashion_mnist.json: 8 epochs of 2 x 235 steps
. "$SRC/tests/integration/deploy/stack.sh"
C() { docker-compose -p "$P" -f "$FILE" "$@"; }
CT() { docker-compose -p "$P" -f "$FILE" -f "$TBFILE" "$@"; }   # with TensorBoard
cid() { CT ps -q "$1" 2>/dev/null | head -n 1; }
insp() { docker inspect -f "$2" "$(cid "$1")" 2>/dev/null; }
vol() { docker volume inspect -f '{{.Mountpoint}}' "${P}_data" 2>/dev/null; }
ckpt_step() { vol_ckpt "$(vol)"; }   # newest committed checkpoint in the volume, or -1
past_ckpt() { [ "$(ckpt_step)" -gt 0 ]; }
# wait_exited SERVICE SECONDS: until the container has stopped for good
# (exited, not restarting); prints "exit-code restart-count"
wait_exited() {
  local deadline=$((SECONDS + $2)) st
  while :; do
    st=$(insp "$1" '{{.State.Status}} {{.State.ExitCode}} {{.RestartCount}}')
    case "$st" in exited*) echo "${st#exited }"; return 0 ;; esac
    [ $SECONDS -ge $deadline ] && { echo "timeout ${st:-none}"; return 1; }
    sleep 0.5
  done
}
# kill -9 of the service's Tessera process (the child of docker-init)
kill_proc() {
  local pid child
  pid=$(insp "$1" '{{.State.Pid}}')
  child=$(pgrep -P "$pid" | head -n 1)
  [ -n "$child" ] && kill -9 "$child"
}
down() { CT down -v --remove-orphans -t 5 >/dev/null 2>&1; }
save_logs() { C logs --no-color >"$WORK/$1.log" 2>&1; }

engine_stopped=0
cleanup() {
  down
  net_down
  "$PORTS_BIN" release $$
  if [ "$engine_stopped" = 0 ]; then
    docker image rm -f "tsr-ctx-probe:$$" >/dev/null 2>&1
    tsr_docker_stop
  fi
  work_end
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# ---- the engine ---------------------------------------------------------------
engine_begin deploy_compose

# ---- the images -----------------------------------------------------------------
t=$SECONDS
if "$SRC/deploy/docker/build.sh" --tensorboard; then ok "the images build"
else bad "the images build"; exit 1; fi
echo "TIME images $((SECONDS - t)) s"
docker image ls --format 'IMAGE {{.Repository}}:{{.Tag}} {{.Size}}' | grep -E 'tessera|debian'

# what a build context holds, with the repository's .dockerignore
mkdir -p "$WORK/ctx/deploy/jobs" "$WORK/ctx/.git" "$WORK/ctx/build" \
         "$WORK/ctx/build-asan" "$WORK/ctx/out" "$WORK/ctx/common"
cp "$SRC/.dockerignore" "$WORK/ctx/"
for f in deploy/token .git/HEAD build/build.ninja build-asan/x out/report.html \
         common/log.c deploy/jobs/job.json; do echo x >"$WORK/ctx/$f"; done
printf 'FROM debian:12\nCOPY . /ctx\n' >"$WORK/ctx/Dockerfile"
if docker build -q -t "tsr-ctx-probe:$$" "$WORK/ctx" >/dev/null 2>"$WORK/probe.log"; then
  list=$(docker run --rm "tsr-ctx-probe:$$" find /ctx -type f | sort | tr '\n' ' ')
  echo "build context: $list"
  check "build context: no token, .git, build folders or out/" \
    test -z "$(grep -oE '/ctx/(deploy/token|\.git/|build/|build-asan/|out/)' <<<"$list")"
  check "build context: the sources" grep -q '/ctx/common/log.c .*/ctx/deploy/jobs/job.json' <<<"$list"
else
  bad "the build-context probe builds"
fi

img=$(C config 2>/dev/null | sed -n 's/^ *image: \(tessera:.*\)/\1/p' | head -n 1)
img=${img:-tessera:0.1.0}
check "image $img runs as 10001:10001" test "$(docker image inspect -f '{{.Config.User}}' "$img")" = 10001:10001
who=$(docker run --rm --entrypoint sh "$img" -c \
  'id -u; getent passwd tessera | cut -d: -f6; test -e /nonexistent && echo home-exists; stat -c "%u %a" /data' 2>/dev/null | tr '\n' ' ')
check "image: uid 10001, no home directory, /data is 10001's ($who)" test "$who" = "10001 /nonexistent 10001 750 "

# compose networks draw their subnets from a pool while checking the
# host's routes: one engine at a time makes its networks
up() {
  flock -w 300 /run/lock/tessera-compose-net.lock \
    docker-compose -p "$P" -f "$FILE" up --no-start >"$WORK/up.log" 2>&1 &&
    C up -d "$@" >>"$WORK/up.log" 2>&1
}
# ---- a token uid 10001 cannot read -----------------------------------------------
"$SRC/deploy/docker/token.sh" "$WORK/token" || bad "token.sh makes a token"
check "token.sh: owner 10001, mode 600" test "$(stat -c '%u %a' "$WORK/token")" = "10001 600"
install -m 0600 -o 0 -g 0 "$WORK/token" "$WORK/badtoken"
check "token.sh --check refuses a root-only token" \
  bash -c "! '$SRC/deploy/docker/token.sh' --check '$WORK/badtoken' 2>/dev/null"
t=$SECONDS
TESSERA_TOKEN_FILE=$WORK/badtoken up --no-deps chief
st=$(wait_exited chief 120)
C logs --no-color chief >"$WORK/badtoken.log" 2>&1
check "unreadable token: the chief stops, exit 2, after 5 restarts ($st)" test "$st" = "2 5"
check "unreadable token: the log says why" grep -q "Permission denied: this process runs as uid 10001" "$WORK/badtoken.log"
down
echo "TIME unreadable-token $((SECONDS - t)) s"

# ---- the Fashion-MNIST job ----------------------------------------------------------
export TESSERA_TOKEN_FILE=$WORK/token
t=$SECONDS
if ! up; then cat "$WORK/up.log"; bad "docker-compose up"; exit 1; fi
check "a bridge between network namespaces works while the engine runs" bash -c '
  . "$0"; net_up 2 || exit 1
  on 2 /usr/bin/python3 -c "
import socket; s = socket.socket(); s.bind((\"10.231.0.2\", 7777)); s.listen(1)
c, _ = s.accept(); c.sendall(b\"through\")" &
  sleep 1
  out=$(on 1 /usr/bin/python3 -c "
import socket; s = socket.create_connection((\"10.231.0.2\", 7777), timeout=10)
print(s.recv(16).decode())")
  wait; net_down; [ "$out" = through ]' "$SRC/tests/integration/netns/netns.sh"
st=$(wait_exited chief 600)
save_logs main
echo "TIME train $((SECONDS - t)) s"
V=$(vol)
check "chief exits 0 ($st)" test "${st%% *}" = 0
for s in ps0 ps1 worker0 worker1; do
  check "$s exits 0 when the chief is done" test "$(insp $s '{{.State.Status}} {{.State.ExitCode}}')" = "exited 0"
done
check "exact step count ($JOB_STEPS)" test "$(json_get "$V/summary.json" steps)" = $JOB_STEPS
acc=$(json_get "$V/summary.json" eval.accuracy)
echo "test accuracy: $acc"
check "test accuracy ${acc:-none} >= 0.86" ge "${acc:-0}" 0.86
check "final checkpoint at step $JOB_STEPS" test "$(ckpt_step)" = $JOB_STEPS
ck=$(ls "$V/checkpoints" 2>/dev/null | tr '\n' ' ')
n=0
for d in "$V"/checkpoints/ckpt-*; do
  [ -f "$d/manifest.json" ] && [ $((10#${d##*ckpt-})) -lt $JOB_STEPS ] && n=$((n + 1))
done
check "periodic checkpoints before the final one ($ck)" test "$n" -ge 2
check "TensorBoard event file in the volume" bash -c "ls '$V'/logs/events.out.tfevents.* >/dev/null"
for s in ps0 ps1; do
  check "$s: its container's memory limit is 2 GiB (deploy.resources)" \
    test "$(insp $s '{{.HostConfig.Memory}}')" = 2147483648
done
check "each PS keeps its checkpoints under /data/checkpoints (--checkpoint-root)" \
  test "$(grep -c 'checkpoint root: /data/checkpoints (--checkpoint-root)' "$WORK/main.log")" -ge 2
check "each PS keeps its shards within its --memory-limit (1600 MiB)" \
  test "$(grep -c 'serving on .*(memory limit 1677721600 bytes[:)]' "$WORK/main.log")" -ge 2
check "no dotfiles in the volume (no home in it)" test -z "$(ls -A "$V" | grep '^\.')"
check "the volume is 10001's" test "$(stat -c %u "$V")" = 10001

# claimed until the cleanup (tests/ports/ports.h): docker binds it later
port=$("$PORTS_BIN" claim 1 $$)
t=$SECONDS
TESSERA_TENSORBOARD_PORT=$port CT up -d --no-deps tensorboard >"$WORK/tb-up.log" 2>&1
tags() { # some run (".", "train", ...) has a loss curve ("loss", "epoch_loss")
  /usr/bin/python3 -c 'import json, sys, urllib.request
t = json.load(urllib.request.urlopen("http://127.0.0.1:%s/data/plugin/scalars/tags" % sys.argv[1], timeout=5))
sys.exit(0 if any(k == "loss" or k.endswith("_loss") for run in t.values() for k in run) else 1)' "$port" 2>/dev/null
}
check "TensorBoard serves the run's loss on 127.0.0.1:$port" wait_for 120 tags
check "TensorBoard is published on 127.0.0.1 only" \
  test "$(docker port "$(cid tensorboard)" 6006 | tr '\n' ' ')" = "127.0.0.1:$port "
CT logs --no-color tensorboard >"$WORK/tensorboard.log" 2>&1
echo "TIME tensorboard $((SECONDS - t)) s"
down

# ---- crashes --------------------------------------------------------------------------
# crash NAME ACTION: a fresh run; ACTION once a checkpoint past step 0 is
# committed; the run must end with the exact step count
crash() {
  local name=$1 action=$2 t=$SECONDS st S
  if ! up; then cat "$WORK/up.log"; bad "$name: up"; return; fi
  if ! wait_for 300 past_ckpt; then bad "$name: a checkpoint past step 0"; save_logs "$name"; down; return; fi
  AT=$(ckpt_step)
  check "$name: the run is still going at step $AT" test ! -e "$(vol)/summary.json"
  $action
  st=$(wait_exited chief 600)
  save_logs "$name"
  S=$(vol)/summary.json
  check "$name: chief exits 0 ($st)" test "${st%% *}" = 0
  check "$name: exact step count ($JOB_STEPS)" test "$(json_get "$S" steps)" = $JOB_STEPS
  check "$name: final checkpoint at step $JOB_STEPS" test "$(ckpt_step)" = $JOB_STEPS
  CRASH_SUMMARY=$S
  echo "TIME crash-$name $((SECONDS - t)) s"
}

after_worker() {
  check "worker kill: the restart policy brought worker1 back" test "$(insp worker1 '{{.RestartCount}}')" -ge 1
  check "worker kill: the chief counted its return" test "$(json_get "$CRASH_SUMMARY" restarts.worker)" -ge 1
}
crash "worker kill -9" "kill_proc worker1"; after_worker; down

crash "ps kill -9" "kill_proc ps1"
check "ps kill: the restart policy brought ps1 back" test "$(insp ps1 '{{.RestartCount}}')" -ge 1
check "ps kill: one recovery" test "$(json_get "$CRASH_SUMMARY" restarts.ps)" -ge 1
check "ps kill: restored from a checkpoint" grep -q "restored the checkpoint of step" "$WORK/ps kill -9.log"
down

crash "chief kill -9" "kill_proc chief"
check "chief kill: the restart policy brought the chief back" test "$(insp chief '{{.RestartCount}}')" -ge 1
check "chief kill: resumed from the checkpoint of step $AT or later" \
  test "$(json_get "$CRASH_SUMMARY" resumed_from_step)" -ge "$AT"
down

ps_docker_kill() {
  docker kill "$(cid ps0)" >/dev/null
  sleep 1
  C up -d --no-deps ps0 >>"$WORK/up.log" 2>&1
}
crash "ps docker kill" ps_docker_kill
check "docker kill + up -d: one recovery" test "$(json_get "$CRASH_SUMMARY" restarts.ps)" -ge 1
down

# ---- the same file as a Swarm stack ------------------------------------------------------------
# when the engine can make a swarm of its own: else said and left out
stack_swarm "$img"
case $? in
  0) trap 'stack_leave; cleanup' EXIT
     stack_runs
     stack_leave
     trap cleanup EXIT ;;
  77) echo "NOTE: $STACK_WHY: the stack runs are left out" ;;
esac

# ---- the host's networking ------------------------------------------------------------------
engine_end "$NET_BEFORE"
