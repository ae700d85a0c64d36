#!/usr/bin/env bash
# The deployment files, checked without a Docker engine or a scheduler
# (deploy_compose, deploy_k8s and deploy_slurm run them):
#  - the compose file validates with docker-compose, and with `docker stack
#    config` where the Docker CLI has it; it holds only keys a swarm takes
#    (no mem_limit, profiles or bridge driver; restarts and memory under
#    deploy; DNS round robin, no virtual IPs); every TF_CONFIG in it
#    resolves with tessera's own reading and names itself; restarts are
#    bounded; TensorBoard is a file of its own on a pinned image, bound to
#    127.0.0.1; the chief checkpoints periodically and each PS keeps its
#    shards under the chief's checkpoint folder (--checkpoint-root);
#  - the Dockerfiles hide no error (no `|| true`, no 2>/dev/null, `set -e`
#    in every chained RUN), run as uid 10001 with no home; the CUDA one uses
#    Ubuntu 24.04's package names, leaves NCCL to its base, has g++ and the
#    data set; .dockerignore keeps the token, .git and builds out;
#  - the token file: token.sh makes one uid 10001 can read and refuses one
#    it cannot; a process that cannot read its token says which uid it runs
#    as;
#  - the Slurm script parses, asks for no fixed node count, checkpoints by
#    time and passes --checkpoint-root; each rank gets its role.
set -u
T=$TSR_BUILD_DIR/chief/tessera
D=$TSR_SOURCE_DIR/deploy
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
W=$(mktemp -d /tmp/tsr_deploy_XXXXXX)
trap 'rm -rf "$W"' EXIT

# ---- compose -----------------------------------------------------------------
echo token >"$W/token"
if command -v docker-compose >/dev/null; then
  if out=$(TESSERA_TOKEN_FILE=$W/token docker-compose -f "$D/docker-compose.yml" \
           -f "$D/docker-compose.tensorboard.yml" config 2>/dev/null); then
    ok "docker-compose config validates"
  else
    bad "docker-compose config: $(TESSERA_TOKEN_FILE=$W/token docker-compose -f "$D/docker-compose.yml" \
           -f "$D/docker-compose.tensorboard.yml" config 2>&1 | tail -n 3)"
  fi
else
  bad "docker-compose is not installed (deploy/setup.sh test installs it)"; out=""
fi
n=0
while IFS= read -r cfg; do
  n=$((n + 1))
  task=$(TF_CONFIG="$cfg" "$T" cluster --task-only 2>&1)
  if [[ "$task" =~ ^(chief|ps|worker):[0-9]+$ ]]; then ok "compose TF_CONFIG resolves to $task"
  else bad "compose TF_CONFIG $cfg: $task"; fi
done < <(sed -n "s/^ *TF_CONFIG: '\(.*\)'$/\1/p" "$D/docker-compose.yml")
[ "$n" = 5 ] && ok "five TF_CONFIGs in the compose file" || bad "found $n TF_CONFIGs"
# the resolved configuration, service by service
svc() { # service key: the value of key in the service's resolved block
  awk -v s="  $1:" -v k="$2" '
    $0 == s {in_s = 1; next}
    in_s && /^  [a-z]/ {in_s = 0}
    in_s && $1 == k":" {sub(/^ *[a-z_]+: */, ""); print; exit}' <<<"$out"
}
for s in chief ps0 ps1 worker0 worker1 tensorboard; do
  r=$(svc $s restart)
  check "compose $s: bounded restarts (restart: $r)" \
    bash -c "[[ '$r' =~ ^on-failure:[0-9]+$ ]]"
done
check "compose: no service restarts unless-stopped or always" \
  bash -c "! grep -Eq 'restart: *(always|unless-stopped)' '$D/docker-compose.yml'"
tb_img=$(svc tensorboard image)
check "compose tensorboard: a file of its own, not in the stack file" \
  bash -c "! grep -q '^  tensorboard:' '$D/docker-compose.yml' && grep -q '^  tensorboard:' '$D/docker-compose.tensorboard.yml'"
check "compose tensorboard: a pinned image of its own ($tb_img)" \
  bash -c "[[ '$tb_img' =~ ^tessera-tensorboard:[0-9] ]]"
check "compose tensorboard: published on 127.0.0.1 only" \
  bash -c "grep -q '\"127.0.0.1:\${TESSERA_TENSORBOARD_PORT:-6006}:6006\"' '$D/docker-compose.tensorboard.yml' &&
           ! grep -Eq '^ *- *\"?[0-9]+:[0-9]+' '$D/docker-compose.tensorboard.yml' &&
           ! grep -q 'ports:' '$D/docker-compose.yml'"
check "compose chief: periodic checkpoints into the volume" \
  bash -c "grep -q 'checkpoint.every_steps=' '$D/docker-compose.yml' &&
           grep -q '/data/checkpoints' '$D/docker-compose.yml'"
# a PS keeps its shards under --memory-limit, with room left in its container
for s in ps0 ps1; do
  ml=$(/usr/bin/python3 -c 'import sys, yaml
svc = yaml.safe_load(sys.stdin)["services"][sys.argv[1]]
cmd = svc.get("command", [])
ml = cmd[cmd.index("--memory-limit") + 1] if "--memory-limit" in cmd else ""
print(ml, svc.get("deploy", {}).get("resources", {}).get("limits", {}).get("memory", ""))' $s <<<"$out" 2>&1)
  check "compose $s: --memory-limit within 85% of the container's deploy.resources limit ($ml)" \
    /usr/bin/python3 -c 'import re, sys
def b(v):
    m = re.fullmatch(r"([0-9.]+)([kKmMgGtT]?)(i?[bB]?)", v)
    return float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " ") if m else 0
ps, lim = (sys.argv[1].split() + ["", ""])[:2]
sys.exit(0 if 0 < b(ps) <= 0.85 * b(lim) else 1)' "$ml"
done
# a swarm takes the same file
check "compose: no key a swarm refuses (mem_limit, profiles, a bridge driver)" \
  bash -c "! grep -Eq '^ *(mem_limit|profiles):|driver: *bridge' '$D/docker-compose.yml'"
sw=$(/usr/bin/python3 -c 'import sys, yaml
f = yaml.safe_load(open(sys.argv[1]))
ck = None
for n, s in f["services"].items():
    d = s.get("deploy", {})
    rp = d.get("restart_policy", {})
    if d.get("endpoint_mode") != "dnsrr":
        print("%s: endpoint_mode %s" % (n, d.get("endpoint_mode")))
    if rp.get("condition") != "on-failure" or not rp.get("max_attempts"):
        print("%s: restart_policy %s" % (n, rp))
    c = s.get("command", [])
    if "--checkpoint-dir" in c:
        ck = c[c.index("--checkpoint-dir") + 1]
for n, s in f["services"].items():
    c = s.get("command", [])
    if c and c[0] == "tessera-ps":
        r = c[c.index("--checkpoint-root") + 1] if "--checkpoint-root" in c else None
        if r != ck:
            print("%s: --checkpoint-root %s, the chief checkpoints in %s" % (n, r, ck))' "$D/docker-compose.yml" 2>&1)
check "compose: every service by DNS round robin with bounded swarm restarts; each PS's --checkpoint-root the chief's folder${sw:+ ($sw)}" \
  test -z "$sw"
if docker stack config --help >/dev/null 2>&1; then
  if so=$(TESSERA_TOKEN_FILE=$W/token DOCKER_HOST=unix://$W/none.sock \
          docker stack config -c "$D/docker-compose.yml" 2>&1 >/dev/null); then
    ok "docker stack config takes the compose file"
  else
    bad "docker stack config: $so"
  fi
else
  echo "note: this Docker CLI has no 'stack config' (the stack itself runs in deploy_compose)"
fi
check "compose: every Tessera service runs the pinned image" \
  test "$(grep -c 'image: ${TESSERA_IMAGE:-tessera:[0-9]' "$D/docker-compose.yml")" = 1

# ---- Dockerfiles -------------------------------------------------------------
for f in Dockerfile Dockerfile.cuda Dockerfile.tensorboard; do
  df=$D/$f
  check "$f: no '|| true'" bash -c "! grep -v '^#' '$df' | grep -q '|| *true'"
  check "$f: no error sent to /dev/null" bash -c "! grep -v '^#' '$df' | grep -q '2>/dev/null'"
  # every RUN whose command chains with ; or && starts with set -e
  bad_runs=$(awk '/^RUN /{cmd=$0; while (cmd ~ /\\$/) {getline l; cmd = cmd l}
              if (cmd ~ /(;|&&)/ && cmd !~ /^RUN set -eu/) print NR}' "$df")
  check "$f: every chained RUN starts with set -eu (${bad_runs:-all do})" test -z "$bad_runs"
  check "$f: runs as 10001:10001" grep -q '^USER 10001:10001$' "$df"
  check "$f: no home directory (no --create-home)" \
    bash -c "! grep -q -- '--create-home' '$df' && grep -q -- '--no-create-home' '$df'"
done
cu=$D/Dockerfile.cuda
check "Dockerfile.cuda: Ubuntu 24.04 names (libmsgpackc2, the t64 libraries)" \
  bash -c "grep -qw libmsgpackc2 '$cu' && grep -qw libuv1t64 '$cu' && ! grep -q 'libmsgpack-c2' '$cu' &&
           grep -qw libpng16-16t64 '$cu' && grep -qw libhdf5-103-1t64 '$cu' && ! grep -q 'libjpeg62-turbo' '$cu'"
check "Dockerfile.cuda: NCCL left to the CUDA image (no libnccl package)" \
  bash -c "! grep -Eq 'install.*libnccl|^ +libnccl' '$cu'"
check "Dockerfile.cuda: g++ for nvcc" grep -Eq '^ +meson .* g\+\+ ' "$cu"
check "Dockerfile.cuda: the data set" grep -q 'COPY --from=data /usr/share/datasets/fashion-mnist' "$cu"
for p in deploy/token .git build out; do
  check ".dockerignore leaves out $p" grep -Eq "^$p(/|\*?/?)?$|^${p}\*/$" "$TSR_SOURCE_DIR/.dockerignore"
done

# ---- the token file ----------------------------------------------------------
TK=$D/docker/token.sh
if [ "$(id -u)" = 0 ]; then
  "$TK" "$W/new" >/dev/null
  check "token.sh makes a token owned by 10001, mode 600" test "$(stat -c '%u %a' "$W/new")" = "10001 600"
  install -m 0600 -o 0 "$W/new" "$W/rootonly"
  check "token.sh --check refuses a token only root can read" bash -c "! '$TK' --check '$W/rootonly' 2>/dev/null"
  chmod 0644 "$W/rootonly"
  check "token.sh --check accepts mode 0644" "$TK" --check "$W/rootonly"
  chmod 0600 "$W/rootonly"
  msg=$(TF_CONFIG='{"cluster":{"ps":["127.0.0.1:1"],"worker":["127.0.0.1:2"]},"task":{"type":"ps","index":0}}' \
        setpriv --reuid 10001 --regid 10001 --clear-groups \
        "$TSR_BUILD_DIR/ps/tessera-ps" --token-file "$W/rootonly" 2>&1)
  rc=$?
  check "a PS that cannot read its token: exit 2, says its uid ($msg)" \
    bash -c "[ $rc = 2 ] && grep -q 'Permission denied: this process runs as uid 10001' <<<'$msg'"
else
  echo "note: not root: token ownership checks left out"
fi

# ---- Slurm --------------------------------------------------------------------
# 5 tasks on 3 nodes, jobs dealt as the sbatch script asks.
roles=""
for rank in 0 1 2 3 4; do
  r=$(SLURM_PROCID=$rank SLURM_JOB_NODELIST="node[1-3]" SLURM_TASKS_PER_NODE="2(x2),1" \
      TESSERA_SLURM_JOBS="chief:1,ps:2,worker:*" env -u TF_CONFIG "$T" cluster --task-only)
  roles+="$r "
done
[ "$roles" = "chief:0 ps:0 ps:1 worker:0 worker:1 " ] && ok "Slurm ranks get their roles ($roles)" || bad "Slurm roles: $roles"
grep -q 'TESSERA_SLURM_JOBS' "$D/slurm/tessera.sbatch" && bash -n "$D/slurm/tessera.sbatch" \
  && ok "sbatch script parses" || bad "sbatch script"
check "sbatch script: the node count comes from the allocation (no #SBATCH --nodes)" \
  bash -c "! grep -Eq '^#SBATCH +(--nodes|-N)' '$D/slurm/tessera.sbatch'"
check "sbatch script: checkpoints by time, the PS's --checkpoint-root" \
  bash -c "grep -q 'checkpoint.every_secs=\$TESSERA_CHECKPOINT_SECS' '$D/slurm/tessera.sbatch' &&
           grep -q 'tessera-ps .*--checkpoint-root \"\$run/checkpoints\"' '$D/slurm/tessera.sbatch'"
for f in "$D"/docker/*.sh; do
  check "$(basename "$f") parses" bash -n "$f"
done

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
