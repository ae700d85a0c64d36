#!/bin/sh
# The coordinator's state machine is pure: its object files call no libuv,
# no RPC, no clock, no file or process function (only memory, strings and
# the scheduler). $1: the machine's static library.
lib=${1:?library}
command -v nm >/dev/null || { echo "no nm: skipped"; exit 77; }
bad=$(nm "$lib" | awk '$1 == "U" {print $2}' |
      grep -E '^(uv_|tsr_rpc_|tsr_now|tsr_wall|tsr_log|tsr_sleep|clock_gettime|time|gettimeofday|f?open|openat|read|write|fwrite|fprintf|printf|puts|unlink|mkdir|rename|socket|connect|send|recv|kill|exit|abort|getenv|rand|random)$')
if [ -n "$bad" ]; then
  echo "the state machine calls: $bad"
  exit 1
fi
echo "pure: only $(nm "$lib" | awk '$1 == "U" {print $2}' | sort -u | grep -vc '^chief_sched_\|^sm__') outside calls (memory, strings)"
