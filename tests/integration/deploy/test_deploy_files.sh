#!/usr/bin/env bash
# The deployment files as far as this machine can check them: the compose
# file validates with docker-compose (no daemon needed for that), every
# TF_CONFIG in it resolves with tessera's own reading and names itself, and
# the Slurm script's role lookup gives each rank its task.
set -u
T=$TSR_BUILD_DIR/chief/tessera
D=$TSR_SOURCE_DIR/deploy
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }

if command -v docker-compose >/dev/null; then
  if out=$(docker-compose -f "$D/docker-compose.yml" config 2>&1); then
    ok "docker-compose config validates"
  else
    bad "docker-compose config: $out"
  fi
else
  bad "docker-compose is not installed (deploy/setup.sh test installs it)"
fi

n=0
while IFS= read -r cfg; do
  n=$((n + 1))
  task=$(TF_CONFIG="$cfg" "$T" cluster --task-only 2>&1)
  if [[ "$task" =~ ^(chief|ps|worker):[0-9]+$ ]]; then ok "compose TF_CONFIG resolves to $task"
  else bad "compose TF_CONFIG $cfg: $task"; fi
done < <(sed -n "s/^ *TF_CONFIG: '\(.*\)'$/\1/p" "$D/docker-compose.yml")
[ "$n" = 5 ] && ok "five TF_CONFIGs in the compose file" || bad "found $n TF_CONFIGs"

# Slurm: 5 tasks on 3 nodes, jobs dealt as the sbatch script asks.
roles=""
for rank in 0 1 2 3 4; do
  r=$(SLURM_PROCID=$rank SLURM_JOB_NODELIST="node[1-3]" SLURM_TASKS_PER_NODE="2(x2),1" \
      TESSERA_SLURM_JOBS="chief:1,ps:2,worker:*" env -u TF_CONFIG "$T" cluster --task-only)
  roles+="$r "
done
[ "$roles" = "chief:0 ps:0 ps:1 worker:0 worker:1 " ] && ok "Slurm ranks get their roles ($roles)" || bad "Slurm roles: $roles"
grep -q 'TESSERA_SLURM_JOBS' "$D/slurm/tessera.sbatch" && bash -n "$D/slurm/tessera.sbatch" \
  && ok "sbatch script parses" || bad "sbatch script"
for f in "$D"/k8s/*.yaml; do
  grep -q "tessera" "$f" && ok "$(basename "$f") present" || bad "$f"
done

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
