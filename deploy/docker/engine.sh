#!/usr/bin/env bash
# A Docker engine for Tessera's images and compose cluster, on a Debian 12
# machine where none may run yet. Sourced by the other scripts here (and by
# the deploy_compose test), or run:
#
#   deploy/docker/engine.sh run CMD...   start an engine if none answers,
#                                        run CMD with DOCKER_HOST set, stop
#                                        the engine it started; CMD's status
#   deploy/docker/engine.sh start        start one and leave it running
#                                        (prints the DOCKER_HOST to export)
#   deploy/docker/engine.sh stop         stop the one `start` left running
#   deploy/docker/engine.sh status       which engine the scripts would use
#
# Happy path: an engine already answers (DOCKER_HOST, /var/run/docker.sock,
# or one that `start` left) and is used as it is; nothing is started or
# stopped. Otherwise docker.io is installed when dockerd is missing, and a
# private dockerd is started: its own socket and run folder under /run, its
# data (images, build cache, volumes) in $TSR_DOCKER_CACHE/engine so a later
# run reuses the built images, cgroupfs, overlay2. It leaves the machine's
# networking alone: no iptables rules, no FORWARD policy, no ip_forward, no
# NAT, no docker0 (--iptables=false --ip-forward=false --ip-masq=false
# --bridge=none); containers on a compose bridge network reach each other
# and nothing outside, and builds use the host's network (--network host).
# The networking settings are recorded before it starts and compared after
# it stops; anything it changed is put back and reported.
#
# Failure modes: no root to install or start an engine, dockerd that does
# not answer within TSR_DOCKER_START_TIMEOUT seconds (its log is printed),
# a data folder still held by an engine that did not stop. Each says so
# and returns non-zero; an engine this script started is always stopped by
# its pid (SIGTERM, then SIGKILL after 30 s), its containerd with it.
#
# Environment: TSR_DOCKER_CACHE (default: build/docker under the repository)
# holds the engine's data and the base image tarball.

tsr_dk_say() { printf '[docker] %s\n' "$*" >&2; }

TSR_DK_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
: "${TSR_DOCKER_CACHE:=$TSR_DK_ROOT/build/docker}"
: "${TSR_DOCKER_START_TIMEOUT:=60}"
TSR_DK_STARTED_PID=""   # the dockerd this shell started, if any
TSR_DK_EXEC=""          # its run folder (socket, pid files, containerd)
TSR_DK_NET_BEFORE=""    # host networking before it started

# Root or sudo for the commands that need it.
tsr_dk_sudo() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# Installs docker.io (dockerd, containerd, runc, docker-init) and
# docker-compose when they are missing.
tsr_docker_install() {
  local need=()
  command -v dockerd >/dev/null 2>&1 || [ -x /usr/sbin/dockerd ] || need+=(docker.io)
  command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
  [ ${#need[@]} = 0 ] && return 0
  tsr_dk_say "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  tsr_dk_sudo apt-get update -qq &&
    tsr_dk_sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
}

# True when the engine at DOCKER_HOST (or the default socket) answers.
tsr_dk_answers() {
  timeout 20 docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

# The host's networking settings that an engine could change: bridge
# netfilter, forwarding, every iptables table, and the bridges Docker
# names (docker0, docker_gwbridge, br-<id>). Veth pairs of other tests come and go, so
# other links are not compared.
tsr_dk_net_state() {
  local k
  for k in net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables \
           net.bridge.bridge-nf-call-arptables net.ipv4.ip_forward \
           net.ipv4.conf.all.forwarding net.ipv6.conf.all.forwarding; do
    printf '%s = %s\n' "$k" "$(sysctl -n "$k" 2>/dev/null || echo absent)"
  done
  { iptables-save 2>/dev/null; ip6tables-save 2>/dev/null; } |
    sed -e '/^#/d' -e 's/\[[0-9]*:[0-9]*\]//g'
  ip -o link show 2>/dev/null | awk -F': ' '{print $2}' |
    sed 's/@.*//' | grep -E '^(docker0|docker_gwbridge|br-[0-9a-f]{12})$' | sed 's/^/link /'
  return 0
}

# True when AFTER is BEFORE in what any engine could change for the whole
# machine: the sysctls and iptables. Bridges come and go with every engine
# of the machine; an engine's own are checked when it stops
# (tsr_dk_own_links).
tsr_dk_net_same() { # before-state after-state
  [ "$(grep -v '^link ' <<<"$1")" = "$(grep -v '^link ' <<<"$2")" ]
}

# The host links of the engine at DOCKER_HOST's networks: br-<id> of each
# bridge network, docker_gwbridge, docker0 (one per line).
tsr_dk_own_links() {
  docker network ls --no-trunc --filter driver=bridge --format '{{.ID}} {{.Name}}' 2>/dev/null |
    while read -r id name; do
      case "$name" in
        docker_gwbridge) echo docker_gwbridge ;;
        bridge) echo docker0 ;;
        *) echo "br-${id:0:12}" ;;
      esac
    done
}

# Puts back what an engine changed (sysctls and FORWARD policies); says
# what it found. Returns 1 when anything had changed.
tsr_dk_net_restore() { # before-state
  local before=$1 after changed=0 line k v
  after=$(tsr_dk_net_state)
  tsr_dk_net_same "$before" "$after" && return 0
  tsr_dk_say "the host's networking changed while the engine ran:"
  diff <(echo "$before") <(echo "$after") | sed 's/^/[docker]   /' >&2
  while IFS= read -r line; do
    case "$line" in
      net.*' = '*)
        k=${line%% = *}; v=${line#* = }
        [ "$v" = absent ] && continue
        if [ "$(sysctl -n "$k" 2>/dev/null)" != "$v" ]; then
          tsr_dk_sudo sysctl -q -w "$k=$v" && changed=1
        fi ;;
      ':FORWARD '*)
        v=${line#:FORWARD }; v=${v%% *}
        iptables -S FORWARD 2>/dev/null | grep -q -- "^-P FORWARD $v" ||
          { tsr_dk_sudo iptables -P FORWARD "$v" && changed=1; } ;;
    esac
  done <<<"$before"
  [ "$changed" = 1 ] && tsr_dk_say "restored the sysctls and FORWARD policy above"
  return 1
}

# Starts a private dockerd unless an engine answers. Sets DOCKER_HOST.
tsr_docker_start() {
  if [ -n "${DOCKER_HOST:-}" ] && tsr_dk_answers; then
    tsr_dk_say "using the engine at $DOCKER_HOST"; return 0
  fi
  if [ -z "${DOCKER_HOST:-}" ] && [ -S /var/run/docker.sock ] && tsr_dk_answers; then
    tsr_dk_say "using the engine at /var/run/docker.sock"; return 0
  fi
  local left="$TSR_DOCKER_CACHE/engine.env" sock
  if [ -f "$left" ]; then
    sock=$(sed -n 's/^DOCKER_HOST=//p' "$left")
    if [ -n "$sock" ] && DOCKER_HOST=$sock tsr_dk_answers; then
      export DOCKER_HOST=$sock
      tsr_dk_say "using the engine left running by engine.sh start ($DOCKER_HOST)"
      return 0
    fi
  fi
  tsr_docker_install || { tsr_dk_say "cannot install docker.io"; return 1; }
  if [ "$(id -u)" != 0 ]; then
    tsr_dk_say "no Docker engine answers, and starting one needs root"; return 1
  fi
  mkdir -p "$TSR_DOCKER_CACHE/engine" || return 1
  # An engine this script started earlier (and that was not stopped, e.g.
  # its shell was killed) still holds the data folder.
  local old="" oldexec=""
  if [ -f "$TSR_DOCKER_CACHE/engine.pid" ]; then
    read -r old oldexec <"$TSR_DOCKER_CACHE/engine.pid" || old=""
  fi
  if [ -n "$old" ] && [ -r "/proc/$old/cmdline" ] &&
     tr '\0' ' ' <"/proc/$old/cmdline" | grep -q -- "--data-root $TSR_DOCKER_CACHE/engine "; then
    tsr_dk_say "dockerd pid $old still uses $TSR_DOCKER_CACHE/engine;" \
      "stop it first (deploy/docker/engine.sh stop, or kill $old)"
    return 1
  fi
  if [ -n "$oldexec" ] && [ -d "$oldexec" ]; then
    # that dockerd died without being stopped (its shell was killed):
    # what it started may still run and hold the data folder
    tsr_dk_say "cleaning up after dockerd pid $old, which was not stopped"
    local c
    for c in $(runc --root "$oldexec/runtime-runc/moby" list -q 2>/dev/null); do
      runc --root "$oldexec/runtime-runc/moby" kill "$c" KILL 2>/dev/null
      runc --root "$oldexec/runtime-runc/moby" delete -f "$c" 2>/dev/null
    done
    for c in $(pgrep -f "containerd-shim.*-address $oldexec/" 2>/dev/null); do kill -KILL "$c"; done
    TSR_DK_STARTED_PID=$old TSR_DK_EXEC=$oldexec TSR_DK_NET_BEFORE=$(tsr_dk_net_state)
    tsr_docker_stop || true
  fi
  TSR_DK_EXEC=$(mktemp -d /run/tsr-docker.XXXXXX) || return 1
  TSR_DK_NET_BEFORE=$(tsr_dk_net_state)
  local log="$TSR_DOCKER_CACHE/dockerd.log"
  dockerd --data-root "$TSR_DOCKER_CACHE/engine" --exec-root "$TSR_DK_EXEC" \
    --pidfile "$TSR_DK_EXEC/dockerd.pid" -H "unix://$TSR_DK_EXEC/docker.sock" \
    --bridge=none --iptables=false --ip6tables=false --ip-forward=false \
    --ip-masq=false --exec-opt native.cgroupdriver=cgroupfs \
    --storage-driver overlay2 --shutdown-timeout 10 \
    >"$log" 2>&1 </dev/null &
  TSR_DK_STARTED_PID=$!
  echo "$TSR_DK_STARTED_PID $TSR_DK_EXEC" >"$TSR_DOCKER_CACHE/engine.pid"
  export DOCKER_HOST="unix://$TSR_DK_EXEC/docker.sock"
  local deadline=$((SECONDS + TSR_DOCKER_START_TIMEOUT))
  until tsr_dk_answers; do
    if ! kill -0 "$TSR_DK_STARTED_PID" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
      tsr_dk_say "dockerd did not start (log $log):"
      tail -n 20 "$log" | sed 's/^/[docker]   /' >&2
      tsr_docker_stop
      return 1
    fi
    sleep 0.5
  done
  tsr_dk_say "started dockerd pid $TSR_DK_STARTED_PID ($DOCKER_HOST, data in $TSR_DOCKER_CACHE/engine)"
}

# Stops the dockerd this shell started (by its pid) and its containerd;
# checks the host's networking against what it was and that none of its
# networks' bridges is left. Returns 1 when the networking had changed
# (after putting it back), a bridge of its own is left, or the engine would
# not stop.
tsr_docker_stop() {
  local pid=$TSR_DK_STARTED_PID rc=0 cpid own l
  [ -n "$pid" ] || return 0
  cpid=$(cat "$TSR_DK_EXEC/containerd/containerd.pid" 2>/dev/null || true)
  own=$(tsr_dk_own_links)
  # (by its pid, and only while that pid is still a dockerd)
  if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q '^dockerd '; then
    kill -TERM "$pid"
    local deadline=$((SECONDS + 30))
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
      tsr_dk_say "dockerd pid $pid did not stop in 30 s; killing it"
      kill -KILL "$pid"; rc=1
    fi
  fi
  wait "$pid" 2>/dev/null
  # containerd normally leaves with dockerd; if dockerd was killed it may not
  if [ -n "$cpid" ] && kill -0 "$cpid" 2>/dev/null &&
     tr '\0' ' ' <"/proc/$cpid/cmdline" 2>/dev/null | grep -q containerd; then
    kill -TERM "$cpid"; sleep 1; kill -0 "$cpid" 2>/dev/null && kill -KILL "$cpid"
  fi
  rm -f "$TSR_DOCKER_CACHE/engine.pid"
  if [ -n "$TSR_DK_EXEC" ]; then
    # dockerd leaves the host's network namespace bind-mounted there
    local m
    for m in $(findmnt -rn -o TARGET | grep "^$TSR_DK_EXEC/" | sort -r); do
      umount "$m" 2>/dev/null || umount -l "$m"
    done
    rm -rf "$TSR_DK_EXEC"
  fi
  tsr_dk_net_restore "$TSR_DK_NET_BEFORE" || rc=1
  for l in $own; do
    if ip link show "$l" >/dev/null 2>&1; then
      tsr_dk_say "the engine left its bridge $l behind"
      rc=1
    fi
  done
  tsr_dk_say "stopped dockerd pid $pid"
  TSR_DK_STARTED_PID=""
  TSR_DK_EXEC=""
  unset DOCKER_HOST
  return $rc
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -u
  case "${1:-}" in
    run)
      shift
      [ $# -gt 0 ] || { echo "usage: engine.sh run CMD..." >&2; exit 2; }
      tsr_docker_start || exit 1
      trap 'tsr_docker_stop' EXIT
      trap 'exit 130' INT TERM
      "$@"
      exit $?
      ;;
    start)
      tsr_docker_start || exit 1
      if [ -n "$TSR_DK_STARTED_PID" ]; then
        printf 'DOCKER_HOST=%s\nPID=%s\nEXEC=%s\n' "$DOCKER_HOST" \
          "$TSR_DK_STARTED_PID" "$TSR_DK_EXEC" >"$TSR_DOCKER_CACHE/engine.env"
        printf '%s\n' "$TSR_DK_NET_BEFORE" >"$TSR_DOCKER_CACHE/engine.net"
      fi
      echo "export DOCKER_HOST=$DOCKER_HOST"
      ;;
    stop)
      f="$TSR_DOCKER_CACHE/engine.env"
      [ -f "$f" ] || { tsr_dk_say "no engine left running by engine.sh start"; exit 0; }
      TSR_DK_STARTED_PID=$(sed -n 's/^PID=//p' "$f")
      TSR_DK_EXEC=$(sed -n 's/^EXEC=//p' "$f")
      TSR_DK_NET_BEFORE=$(cat "$TSR_DOCKER_CACHE/engine.net" 2>/dev/null)
      rm -f "$f" "$TSR_DOCKER_CACHE/engine.net"
      tsr_docker_stop
      ;;
    status)
      if [ -n "${DOCKER_HOST:-}" ] && tsr_dk_answers; then
        echo "engine at $DOCKER_HOST"
      elif [ -S /var/run/docker.sock ] && tsr_dk_answers; then
        echo "engine at /var/run/docker.sock"
      elif [ -f "$TSR_DOCKER_CACHE/engine.env" ]; then
        sed -n 's/^DOCKER_HOST=/engine left by engine.sh start at /p' "$TSR_DOCKER_CACHE/engine.env"
      else
        echo "no engine answers; the scripts would start one"
      fi
      ;;
    *) sed -n '2,14p' "$0"; exit 2 ;;
  esac
fi
