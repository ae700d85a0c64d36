#!/usr/bin/env bash
# A multi-host harness: every "host" is a network namespace with its own
# address (10.231.0.N/24 on eth0), all plugged into a bridge that lives in
# a namespace of its own, so nothing of this machine's own network is
# touched. Everything is created here and removed on exit. Needs root.
#
#   net_up N            hosts 1..N; HOST_NS[i], HOST_IP[i]
#   on I CMD...         runs CMD in host I
#   cut I / restore I   drops every packet in and out of host I (iptables)
#                       and lets them through again
#   host_kill           kills every process left in the hosts
set -u
NS_TAG="tsr$$"
SW_NS="${NS_TAG}sw"
declare -a HOST_NS HOST_IP
NET_HOSTS=0

net_down() {
  local i
  for ((i = 1; i <= NET_HOSTS; i++)); do
    ip netns pids "${HOST_NS[$i]}" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "${HOST_NS[$i]}" 2>/dev/null
  done
  ip netns del "$SW_NS" 2>/dev/null
  NET_HOSTS=0
}

net_up() {
  local n=$1 i
  ip netns add "$SW_NS" || return 1
  ip -n "$SW_NS" link set lo up
  ip -n "$SW_NS" link add br0 type bridge
  ip -n "$SW_NS" link set br0 up
  for ((i = 1; i <= n; i++)); do
    local h="${NS_TAG}h$i" a="v${$}a$i" b="v${$}b$i"
    ip netns add "$h" || return 1
    ip link add "$a" type veth peer name "$b" || return 1
    ip link set "$a" netns "$h"
    ip link set "$b" netns "$SW_NS"
    ip -n "$SW_NS" link set "$b" master br0
    ip -n "$SW_NS" link set "$b" up
    ip -n "$h" link set "$a" name eth0
    ip -n "$h" addr add "10.231.0.$i/24" dev eth0
    ip -n "$h" link set eth0 up
    ip -n "$h" link set lo up
    HOST_NS[$i]=$h
    HOST_IP[$i]="10.231.0.$i"
    NET_HOSTS=$i
  done
}

on() { # host cmd...
  local i=$1; shift
  ip netns exec "${HOST_NS[$i]}" "$@"
}

cut() {
  on "$1" iptables -I INPUT -i eth0 -j DROP
  on "$1" iptables -I OUTPUT -o eth0 -j DROP
}

restore() {
  on "$1" iptables -D INPUT -i eth0 -j DROP
  on "$1" iptables -D OUTPUT -o eth0 -j DROP
}

host_kill() {
  local i
  for ((i = 1; i <= NET_HOSTS; i++)); do
    ip netns pids "${HOST_NS[$i]}" 2>/dev/null | xargs -r kill -9 2>/dev/null
  done
}
