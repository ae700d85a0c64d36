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
#   slow_link I IP PORT MS   host I reaches IP:PORT through a proxy in host I
#                       that delays every chunk of bytes by MS ms, each way
#                       (the kernel has no netem); DNAT sends the host's
#                       connections to the proxy, whose own connections
#                       leave from a second address the rule lets through
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

slow_link() { # host ip port ms
  local i=$1 ip=$2 port=$3 ms=$4 lport=$((40000 + RANDOM % 20000))
  local alt="10.231.0.$((100 + i))"
  on "$i" ip addr add "$alt/24" dev eth0 2>/dev/null
  on "$i" sysctl -qw net.ipv4.conf.all.route_localnet=1
  on "$i" iptables -t nat -A OUTPUT -p tcp -s "${HOST_IP[$i]}" -d "$ip" \
    --dport "$port" -j DNAT --to-destination "127.0.0.1:$lport"
  on "$i" /usr/bin/python3 - "$lport" "$ip" "$port" "$ms" "$alt" <<'PY' &
import asyncio, sys
lport, ip, port, ms = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
src = sys.argv[5]
async def pipe(r, w):
    try:
        while True:
            data = await r.read(65536)
            if not data:
                break
            await asyncio.sleep(ms / 1000.0)
            w.write(data)
            await w.drain()
    except Exception:
        pass
    finally:
        w.close()
async def handle(cr, cw):
    try:
        sr, sw = await asyncio.open_connection(ip, port, local_addr=(src, 0))
    except Exception:
        cw.close()
        return
    await asyncio.gather(pipe(cr, sw), pipe(sr, cw))
async def main():
    srv = await asyncio.start_server(handle, "127.0.0.1", lport)
    async with srv:
        await srv.serve_forever()
asyncio.run(main())
PY
  sleep 0.3
}
