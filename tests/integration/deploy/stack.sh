#!/usr/bin/env bash
# deploy/docker-compose.yml as a Docker Swarm stack, and the checks the
# Docker tests count with. Sourced by test_compose.sh (after its compose
# cases, on the images deploy/docker/build.sh made) and by test_stack.sh
# (on an image made from the build's binaries), after
# deploy/docker/engine.sh, with FILE (the compose file), WORK (a scratch
# folder holding the token file `token`) and JOB_STEPS (the job's exact
# step count) set.
#
#   engine_begin TEST  the engine that answers or one started here; none:
#                      exit 77 (skipped), saying so
#   stack_swarm IMAGE  the engine makes a swarm of its own on 127.0.0.1,
#                      one engine at a time (/run/lock/tessera-swarm.lock),
#                      and a container of IMAGE joins an overlay network:
#                      0 made; 77 the environment cannot (already in a
#                      swarm it did not make here, `swarm init` refused,
#                      an overlay network refused), STACK_WHY says why;
#                      1 the lock did not come
#   stack_runs         `docker stack deploy -c FILE` as it is: every task
#                      Complete, exact steps, accuracy; then a run with
#                      three killed tasks (s_kill)
#   stack_leave        the stack removed, the swarm left, its gateway
#                      bridge removed (the caller's exit trap calls it too)
#   engine_end         the engine stopped when started here, the host's
#                      networking as before; prints the count, the status
#   work_end           WORK kept and its logs shown on a failure, else removed
set -u
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
check() { # description, command...
  local what=$1; shift
  if "$@"; then ok "$what"; else bad "$what"; fi
}
json_get() { # file key.path
  /usr/bin/python3 -c 'import json,sys
v=json.load(open(sys.argv[1]))
for p in sys.argv[2].split("."): v=v[p]
print(v)' "$1" "$2" 2>/dev/null
}
ge() { /usr/bin/python3 -c "import sys; sys.exit(0 if float('$1') >= float('$2') else 1)" 2>/dev/null; }
wait_for() { # SECONDS COMMAND...
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do [ $SECONDS -ge $deadline ] && return 1; sleep 0.2; done
}
# newest committed checkpoint under the volume mounted at $1, or -1
vol_ckpt() {
  local d best=-1 s
  for d in "$1"/checkpoints/ckpt-*; do
    [ -f "$d/manifest.json" ] || continue
    s=$((10#${d##*ckpt-}))
    [ "$s" -gt "$best" ] && best=$s
  done
  echo "$best"
}

# S_* : the stack's services, tasks and volume
S=tsrstack$$
SV=${S}_data
STACK_WHY=""
swarm_made=0
svol() { docker volume inspect -f '{{.Mountpoint}}' "$SV" 2>/dev/null; }
s_ckpt() { vol_ckpt "$(svol)"; }
# the running container of a service's task
s_cid() { docker ps -q --filter "label=com.docker.swarm.service.name=${S}_$1" | head -n 1; }
# every task of the service, newest first: "State ExitCode"
s_states() {
  docker service ps --no-trunc --format '{{.CurrentState}}' "${S}_$1" 2>/dev/null | awk '{print $1}' | tr '\n' ' '
}
chief_done() { case "$(s_states chief)" in Complete*) return 0 ;; esac; return 1; }
s_logs() { # FILE: every service's log
  local sv
  for sv in chief ps0 ps1 worker0 worker1; do docker service logs --raw "${S}_$sv" 2>&1; done >"$WORK/$1.log"
}
s_gone() { [ -z "$(docker ps -aq --filter "label=com.docker.stack.namespace=$S")" ]; }
s_down() {
  docker stack rm "$S" >/dev/null 2>&1
  wait_for 60 s_gone
  docker volume rm "$SV" >/dev/null 2>&1
}
s_deploy() {
  TESSERA_TOKEN_FILE=$WORK/token docker stack deploy -c "$FILE" "$S" >"$WORK/stack-deploy.log" 2>&1
}

stack_leave() {
  [ "$swarm_made" = 1 ] || return 0
  s_down
  docker network rm "tsrprobe$$" >/dev/null 2>&1
  docker swarm leave --force >/dev/null 2>&1
  # the swarm's gateway bridge stays behind the swarm
  docker network rm docker_gwbridge >/dev/null 2>&1
  rm -f "$TSR_DOCKER_CACHE/swarm.node"
  swarm_made=0
  check "the swarm is left, its gateway bridge removed" \
    bash -c "[ \"\$(docker info --format '{{.Swarm.LocalNodeState}}')\" = inactive ] &&
             ! ip link show docker_gwbridge >/dev/null 2>&1"
  flock -u 9 2>/dev/null
  exec 9>&-
}

# stack_swarm IMAGE: a swarm of this engine's own, and an overlay network
# a container of IMAGE (its `tessera --help`) joins: what a stack's tasks
# need of the kernel (VXLAN, network namespaces), tried before any of them
stack_swarm() {
  local img=$1 state node mark="$TSR_DOCKER_CACHE/swarm.node"
  exec 9>/run/lock/tessera-swarm.lock
  if ! flock -w 600 9; then
    bad "the swarm lock (/run/lock/tessera-swarm.lock) within 600 s"
    exec 9>&-
    return 1
  fi
  state=$(docker info --format '{{.Swarm.LocalNodeState}}' 2>/dev/null)
  node=$(docker info --format '{{.Swarm.NodeID}}' 2>/dev/null)
  if [ "$state" != inactive ] && [ -n "$node" ] && [ "$node" = "$(cat "$mark" 2>/dev/null)" ]; then
    # a run killed before it could leave (its trap never ran)
    echo "NOTE: leaving the swarm (node $node) that an interrupted run made"
    docker swarm leave --force >/dev/null 2>&1
    docker network rm docker_gwbridge >/dev/null 2>&1
    state=$(docker info --format '{{.Swarm.LocalNodeState}}' 2>/dev/null)
  fi
  if [ "$state" != inactive ]; then
    STACK_WHY="the engine is in a swarm already (state: ${state:-unknown}), not one made here"
    flock -u 9; exec 9>&-
    return 77
  fi
  if ! docker swarm init --advertise-addr 127.0.0.1 --listen-addr 127.0.0.1:2377 \
       >"$WORK/swarm-init.log" 2>&1; then
    STACK_WHY="the engine makes no swarm: $(tail -n 1 "$WORK/swarm-init.log")"
    flock -u 9; exec 9>&-
    return 77
  fi
  mkdir -p "$TSR_DOCKER_CACHE" &&
    docker info --format '{{.Swarm.NodeID}}' >"$mark" 2>/dev/null
  swarm_made=1
  local rc
  # (docker run: 125 when the daemon cannot start the container, here its
  # network; any other failure is the image's, not the environment's)
  if ! docker network create -d overlay --attachable "tsrprobe$$" >"$WORK/overlay.log" 2>&1; then
    STACK_WHY="the swarm makes no overlay network: $(tail -n 1 "$WORK/overlay.log")"
    stack_leave
    return 77
  fi
  docker run --rm --network "tsrprobe$$" "$img" tessera --help >>"$WORK/overlay.log" 2>&1
  rc=$?
  docker network rm "tsrprobe$$" >/dev/null 2>&1
  if [ "$rc" = 125 ]; then
    STACK_WHY="no container joins an overlay network here: $(tail -n 1 "$WORK/overlay.log")"
    stack_leave
    return 77
  fi
  check "a container of $img joins an overlay network" test "$rc" = 0
  return 0
}

# stack_runs: the file as it is, then a run with killed tasks
stack_runs() {
  local t=$SECONDS V acc sv got
  if ! s_deploy; then cat "$WORK/stack-deploy.log"; bad "docker stack deploy, the file as it is"; return; fi
  ok "docker stack deploy takes the file as it is"
  check "stack: the chief's task completes" wait_for 600 chief_done
  s_logs stack
  V=$(svol)
  echo "TIME stack train $((SECONDS - t)) s"
  for sv in chief ps0 ps1 worker0 worker1; do
    check "stack $sv: its one task ends Complete ($(s_states $sv))" test "$(s_states $sv)" = "Complete "
  done
  check "stack: exact step count ($JOB_STEPS)" test "$(json_get "$V/summary.json" steps)" = "$JOB_STEPS"
  acc=$(json_get "$V/summary.json" eval.accuracy)
  check "stack: test accuracy ${acc:-none} >= 0.86" ge "${acc:-0}" 0.86
  check "stack: each PS at its 2 GiB and 1600 MiB limits" \
    test "$(grep -c 'serving on .*(memory limit 1677721600 bytes[:)]' "$WORK/stack.log")" -ge 2
  check "stack: the fresh volume is 10001's, as the image's /data" test "$(stat -c %u "$V")" = 10001
  s_down

  # killed tasks, each once a checkpoint newer than the last kill is committed
  t=$SECONDS
  LAST=0
  if ! s_deploy; then cat "$WORK/stack-deploy.log"; bad "stack kills: deploy"; return; fi
  s_kill "stack ps1 kill -9" ps1 -9; PS_AT=$AT
  s_kill "stack worker0 docker kill" worker0 docker
  s_kill "stack chief kill -9" chief -9; CH_AT=$AT
  check "stack kills: the chief's last task completes" wait_for 600 chief_done
  s_logs stack-kills
  V=$(svol)
  echo "TIME stack kills $((SECONDS - t)) s"
  check "stack kills: exact step count ($JOB_STEPS)" test "$(json_get "$V/summary.json" steps)" = "$JOB_STEPS"
  for sv in ps1 worker0 chief; do
    check "stack kills: the swarm started $sv again ($(s_states $sv))" \
      bash -c "[[ '$(s_states $sv)' =~ ^Complete\ Failed ]]"
  done
  got=$(sed -n 's/.*restored the checkpoint of step \([0-9]*\).*/\1/p' "$WORK/stack-kills.log" | head -n 1)
  check "stack kills: the PS restored step ${got:-none}, the newest checkpoint ($PS_AT) or later" \
    test "${got:-0}" -ge "$PS_AT"
  # (the service logs come task by task: in time order, the chief that
  # lost worker0 may be a task the chief's kill replaced)
  grep '^20' "$WORK/stack-kills.log" | sort -s -k1,1 >"$WORK/stack-kills.sorted"
  check "stack kills: the chief lost worker0, then took its new task" awk '
    /INFO  chief lost worker:0 /{lost = 1}
    lost && /INFO  chief worker:0 \(.*\) ready /{ok = 1} END {exit !ok}' "$WORK/stack-kills.sorted"
  check "stack kills: the chief resumed from the newest checkpoint ($CH_AT) or later" \
    test "$(json_get "$V/summary.json" resumed_from_step)" -ge "$CH_AT"
  s_down
}

s_newer() { [ "$(s_ckpt)" -gt "$LAST" ]; }
s_kill() { # WHAT SERVICE HOW (-9: the process; docker: docker kill of the container)
  AT=0
  if ! wait_for 300 s_newer; then bad "$1: a checkpoint past step $LAST"; return; fi
  AT=$(s_ckpt); LAST=$AT
  local c pid child
  c=$(s_cid "$2")
  if [ "$3" = docker ]; then
    docker kill "$c" >/dev/null 2>&1
  else
    pid=$(docker inspect -f '{{.State.Pid}}' "$c" 2>/dev/null)
    child=$(pgrep -P "${pid:-0}" | head -n 1)
    [ -n "$child" ] && kill -9 "$child"
  fi
  # (kill -9: the container ends when its init sees the process go)
  check "$1 at checkpoint $AT: the task's container ends" \
    wait_for 30 bash -c "[ -n '$c' ] && ! docker ps -q --no-trunc | grep -q '^$c'"
}

# engine_end NET_BEFORE: stops the engine when this shell started it (none
# of its bridges may be left), checks the host's networking against what it
# was before the engine, and prints the count; the test's status
engine_end() {
  engine_stopped=1
  if [ -n "$TSR_DK_STARTED_PID" ]; then
    check "the engine stopped, leaving none of its bridges" tsr_docker_stop
  fi
  check "the host's sysctls and iptables are as they were" \
    tsr_dk_net_same "$1" "$(tsr_dk_net_state)"
  echo "$pass passed, $fail failed"
  [ "$fail" = 0 ]
}

# engine_begin TEST: the engine that answers, or one started here; none
# can: exit 77, saying so. NET_BEFORE: the host's networking before it
engine_begin() {
  local t=$SECONDS
  NET_BEFORE=$(tsr_dk_net_state)
  if ! tsr_docker_start; then
    echo "SKIP: no Docker engine answers and none can start on this machine" \
         "(see the lines above); $1 did not run"
    exit 77
  fi
  echo "TIME engine $((SECONDS - t)) s"
}

# work_end: WORK's logs shown when a check failed (or KEEP_WORK is set),
# else WORK removed
work_end() {
  if [ "$fail" != 0 ] || [ -n "${KEEP_WORK:-}" ]; then
    echo "logs kept in $WORK"
    for f in "$WORK"/*.log; do [ -f "$f" ] && { echo "---- $f"; tail -n 30 "$f"; }; done
  else
    rm -rf "$WORK"
  fi
}
