#!/usr/bin/env bash
# Runs the tessera front door on good and bad input and checks the output,
# the JSON and the exit status. Usage: test_cli.sh PATH/TO/tessera
set -u
T=$1
fails=0
pass=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

check() { # name, expected status, needle, command...
  local name=$1 want=$2 needle=$3; shift 3
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" != "$want" ]; then
    echo "FAIL $name: exit $rc, want $want"; echo "$out" | head -5; fails=$((fails+1)); return
  fi
  if [ -n "$needle" ] && ! grep -qF -- "$needle" <<<"$out"; then
    echo "FAIL $name: output lacks '$needle'"; echo "$out" | head -8; fails=$((fails+1)); return
  fi
  # bad input: exactly one line of error
  if [ "$want" = 2 ] && [ "$(wc -l <<<"$out")" -gt 2 ]; then
    echo "FAIL $name: more than one error line"; echo "$out"; fails=$((fails+1)); return
  fi
  pass=$((pass+1))
}

ok_cfg='{"cluster":{"chief":["10.0.0.1:2222"],"worker":["10.0.0.2:2222","10.0.0.3:2222"],"ps":["10.0.0.4:2222","10.0.0.5:2222"]},"task":{"type":"worker","index":1}}'

check cluster_table 0 "<- this task" env TF_CONFIG="$ok_cfg" "$T" cluster
check cluster_json 0 '"is_chief": false' env TF_CONFIG="$ok_cfg" "$T" cluster --json
check cluster_task_flag 0 '"type": "ps"' env TF_CONFIG="$ok_cfg" "$T" cluster --json --task ps:1
echo '{"worker":["a:1","b:2"],"ps":["c:3"]}' > "$tmp/c.json"
check cluster_file 0 "acts as chief" env -u TF_CONFIG "$T" cluster --cluster "$tmp/c.json" --task worker:0
check cluster_none 2 "TF_CONFIG" env -u TF_CONFIG "$T" cluster
check cluster_bad_json 2 "malformed JSON" env TF_CONFIG='{"cluster":' "$T" cluster
check cluster_bad_type 2 'task.type "boss"' env TF_CONFIG='{"cluster":{"worker":["a:1"]},"task":{"type":"boss","index":0}}' "$T" cluster
check cluster_bad_index 2 "task.index 3 is out of range" env TF_CONFIG='{"cluster":{"worker":["a:1"]},"task":{"type":"worker","index":3}}' "$T" cluster
check cluster_two_chiefs 2 "at most one chief" env TF_CONFIG='{"cluster":{"chief":["a:1","b:1"]}}' "$T" cluster
check cluster_port 2 'port "99999"' env TF_CONFIG='{"cluster":{"ps":["a:99999"]}}' "$T" cluster
check cluster_empty_addr 2 "empty address" env TF_CONFIG='{"cluster":{"ps":[""]}}' "$T" cluster
check cluster_missing_file 2 "$tmp/nope.json" "$T" cluster --cluster "$tmp/nope.json"

# TF's docstring example: 16 shards of 64 rows over 2 PS
out=$("$T" partition --var w=1024x1024 --max-shards 16 --ps 2 --json)
n=$(grep -c '"variable"' <<<"$out")
if [ "$n" = 16 ] && grep -q '"rows": 64' <<<"$out"; then pass=$((pass+1)); else echo "FAIL partition_minsize: $n shards"; fails=$((fails+1)); fi
check partition_div 0 "3-6" "$T" partition --var v=13x4 --partitioner fixed --num-shards 5 --ps 2
out=$("$T" partition --var v=13x4 --partitioner fixed --num-shards 5 --ps 2 --placement round_robin --json)
rows=$(grep -o '"rows": [0-9]*' <<<"$out" | awk '{printf "%s,", $2}')
if [ "$rows" = "3,3,3,2,2," ]; then pass=$((pass+1)); else echo "FAIL partition_rows: $rows"; fails=$((fails+1)); fi
ps=$(grep -o '"ps": [0-9]*' <<<"$out" | awk '{printf "%s,", $2}')
if [ "$ps" = "0,1,0,1,0," ]; then pass=$((pass+1)); else echo "FAIL partition_rr: $ps"; fails=$((fails+1)); fi
check partition_maxsize 0 "emb" "$T" partition --var emb=100000x64 --partitioner max_size --max-shard-bytes 1048576 --ps 3
check partition_cluster_ps 0 "" env TF_CONFIG="$ok_cfg" "$T" partition --var w=10x10
check partition_zero_dim 2 "dimension 0 is 0" "$T" partition --var w=0x10
check partition_min_bytes 2 "min_shard_bytes 0" "$T" partition --var w=10x10 --min-shard-bytes 0
check partition_max_shards 2 "max_shards -1" "$T" partition --var w=10x10 --max-shards -1
check partition_bad_placement 2 'placement "greedy"' "$T" partition --var w=10x10 --placement greedy
# balanced (the default): the 48-byte shards first, then each 32-byte one
# to the lighter PS; per-PS totals and max/mean printed
out=$("$T" partition --var v=13x4 --partitioner fixed --num-shards 5 --ps 2 --json)
ps=$(grep -o '"ps": [0-9]*' <<<"$out" | awk '{printf "%s,", $2}')
if [ "$ps" = "0,1,0,1,1," ] && grep -q '"max_over_mean"' <<<"$out"; then pass=$((pass+1)); else echo "FAIL partition_balanced: $ps"; fails=$((fails+1)); fi
check partition_totals 0 "max/mean 1.077" "$T" partition --var v=13x4 --partitioner fixed --num-shards 5 --ps 2
echo '{"placement": "round_robin", "partitioner": {"type": "fixed", "num_shards": 5}}' > "$tmp/rr.json"
check partition_job_placement 0 "round_robin placement" "$T" partition --job "$tmp/rr.json" --var v=13x4 --ps 2
echo '{"placement": "striped"}' > "$tmp/badpl.json"
check partition_job_bad_placement 2 'placement "striped"' "$T" partition --job "$tmp/badpl.json" --var v=13x4
check partition_bad_kind 2 '"evenly"' "$T" partition --var w=10x10 --partitioner evenly
check partition_bad_ps 2 "--ps 0" "$T" partition --var w=10x10 --ps 0
check partition_no_vars 2 "no variables" "$T" partition
check partition_bad_dtype 2 'dtype "float128"' "$T" partition --var w=10x10:float128
echo '{"partitioner": {"type": "fixed", "num_shards": 3}}' > "$tmp/job.json"
check partition_job 0 "2/3" "$T" partition --job "$tmp/job.json" --var w=9x2 --ps 2
echo '{"partitioner": {"type": "fixed", "num_shardz": 3}}' > "$tmp/bad.json"
check partition_job_bad 2 "num_shardz: unknown key" "$T" partition --job "$tmp/bad.json" --var w=9x2
# the memory each PS needs: a materialized table its floats, a bit per row
# and the process; the same rows made on first touch their index too
mem_ratio() { # job: the largest PS's memory over its bytes of floats
  "$T" partition --job "$1" --ps 4 --json | /usr/bin/python3 -c '
import json, sys
o = json.load(sys.stdin)
print(max(m / b for m, b in zip(o["ps_memory_bytes"], o["ps_bytes"])))'
}
full=$(mem_ratio "$TSR_SOURCE_DIR/deploy/jobs/ctr_1b_full.json")
touch_=$(mem_ratio "$TSR_SOURCE_DIR/deploy/jobs/ctr_1b.json")
if /usr/bin/python3 -c "import sys; f, t = float('$full'), float('$touch_'); sys.exit(not (1.0 < f < 1.03 and t > 1.5))"; then
  pass=$((pass+1)); else echo "FAIL partition_memory: $full $touch_"; fails=$((fails+1)); fi
check partition_memory_text 0 "MEMORY" "$T" partition --job "$TSR_SOURCE_DIR/deploy/jobs/ctr_1b_full.json" --ps 4
# the job's model gives the variables (Keras names, in creation order)
out=$("$T" partition --job "$TSR_SOURCE_DIR/deploy/jobs/fashion_mnist.json" --ps 2 --json)
names=$(grep -o '"variable": "[^"]*"' <<<"$out" | cut -d'"' -f4 | uniq | tr '\n' ' ')
if [ "$names" = "dense/kernel dense/bias dense_1/kernel dense_1/bias dense_2/kernel dense_2/bias " ]; then pass=$((pass+1)); else echo "FAIL partition_job_model: $names"; fails=$((fails+1)); fi
check unknown_command 2 'unknown command "frobnicate"' "$T" frobnicate

echo "$pass passed, $fails failed"
[ "$fails" = 0 ]
