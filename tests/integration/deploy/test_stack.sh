#!/usr/bin/env bash
# deploy/docker-compose.yml as shipped, as a Docker Swarm stack, on an
# image made in seconds from this build's binaries: the suite's run of the
# stack deploy (test_compose.sh builds the real images, and runs when
# asked; this runs always).
#  - the engine: one that answers, or a private dockerd that
#    deploy/docker/engine.sh starts (and stops by its pid at the end);
#  - the image, under the name the compose file gives it (its
#    TESSERA_IMAGE default; an image of that name already there is tagged
#    so again at the end): `docker import` of a tarball laid out as
#    deploy/Dockerfile lays its image out: tessera, tessera-ps,
#    tessera-worker and tessera-chief of $TSR_BUILD_DIR in /usr/local/bin,
#    every shared library `ldd` names where the loader looks for it, the job files and models
#    under /usr/local/share/tessera, Debian's Fashion-MNIST, user and group
#    10001 with no home, /data owned by 10001 (mode 750), USER 10001:10001,
#    WORKDIR /data; each executable runs in it (--help);
#  - a swarm of the engine's own on 127.0.0.1 and an overlay network a
#    container joins (stack.sh), then exactly `docker stack deploy -c
#    deploy/docker-compose.yml` with no edit (the token through
#    TESSERA_TOKEN_FILE, as an operator sets it): the Fashion-MNIST job to
#    3760 steps and test accuracy >= 0.86, every task Complete, each PS at
#    its limits, the fresh volume 10001's; then a run with kill -9 of ps1's
#    process, `docker kill` of worker0's container and kill -9 of the
#    chief's process, each once a newer checkpoint is committed: the swarm
#    replaces each task, exact steps, the PS restored and the chief resumed
#    from the newest checkpoint;
#  - the swarm left and its gateway bridge removed, the engine stopped (when
#    started here) with none of its bridges left, the host's bridge
#    netfilter, forwarding and iptables settings as they were.
# Skipped (77), saying why, only where the environment cannot, before any
# container of the stack runs: no engine answers or can start, the engine
# is in a swarm it did not make here, `docker swarm init` is refused, or no
# container can join an overlay network (the kernel's VXLAN). Anything
# else is a failure. Prints the time each part took (TIME lines).
set -u
SRC=${TSR_SOURCE_DIR:?TSR_SOURCE_DIR not set}
BUILD=${TSR_BUILD_DIR:?TSR_BUILD_DIR not set}
export TSR_DOCKER_CACHE=${TSR_DOCKER_CACHE:-$BUILD/docker}
. "$SRC/deploy/docker/engine.sh"
# the containers' level, image and job come from the compose file
unset TESSERA_LOG TESSERA_IMAGE TESSERA_JOB TESSERA_TOKEN_FILE

FILE="$SRC/deploy/docker-compose.yml"
WORK=$(mktemp -d /tmp/tsr_stack_XXXXXX)
JOB_STEPS=3760   # deploy/jobs/fashion_mnist.json: 8 epochs of 2 x 235 steps
. "$SRC/tests/integration/deploy/stack.sh"

IMG=$(sed -n 's/^ *image: *\${TESSERA_IMAGE:-\([^}]*\)}.*/\1/p' "$FILE" | head -n 1)
img_made=""   # the image imported here
img_before="" # the image that had the name before, named so again at the end
img_back() {
  [ -n "$img_made" ] || return 0
  if [ -n "$img_before" ]; then docker tag "$img_before" "$IMG" >/dev/null 2>&1; fi
  docker image rm "$img_made" >/dev/null 2>&1
  img_made=""
}
engine_stopped=0
cleanup() {
  stack_leave
  if [ "$engine_stopped" = 0 ]; then
    img_back
    tsr_docker_stop
  fi
  work_end
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# ---- the engine ---------------------------------------------------------------
engine_begin deploy_stack

# ---- the image ------------------------------------------------------------------
# make_root DIR: the image's files, as deploy/Dockerfile's runtime stage
# has them
make_root() {
  local r=$1 b n l d libs
  mkdir -p "$r/usr/local/bin" "$r/usr/local/share/tessera" "$r/usr/share/datasets" \
           "$r/etc" "$r/data" "$r/tmp" || return 1
  for b in chief/tessera ps/tessera-ps worker/tessera-worker chief/tessera-chief; do
    cp "$BUILD/$b" "$r/usr/local/bin/" || return 1
    libs=$(ldd "$BUILD/$b") || return 1
    if grep 'not found' <<<"$libs"; then echo "$b: a library is missing"; return 1; fi
    # NAME PATH: where ldd found each; one outside the loader's own search
    # path (found through this machine's ld.so.cache, as OpenBLAS's
    # alternative is) goes under its name into /usr/lib/x86_64-linux-gnu
    while read -r n l; do
      case "${l%/*}" in
        /lib64|/lib/x86_64-linux-gnu|/usr/lib/x86_64-linux-gnu) d=$l ;;
        *) d=/usr/lib/x86_64-linux-gnu/$n ;;
      esac
      [ -e "$r$d" ] && continue
      mkdir -p "$r${d%/*}" && cp -L "$l" "$r$d" || return 1
    done < <(awk '$2 == "=>" && $3 ~ /^\// {print $1, $3} $1 ~ /^\// {print $1, $1}' <<<"$libs")
  done
  cp -r "$SRC/deploy/jobs" "$SRC/deploy/models" "$r/usr/local/share/tessera/" &&
    cp -r /usr/share/datasets/fashion-mnist "$r/usr/share/datasets/" || return 1
  printf 'root:x:0:0:root:/root:/bin/sh\ntessera:x:10001:10001::/nonexistent:/usr/sbin/nologin\n' \
    >"$r/etc/passwd"
  printf 'root:x:0:\ntessera:x:10001:\n' >"$r/etc/group"
  printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$r/etc/nsswitch.conf"
  chown 10001:10001 "$r/data" && chmod 0750 "$r/data" && chmod 1777 "$r/tmp"
}
t=$SECONDS
img_before=$(docker image inspect -f '{{.Id}}' "$IMG" 2>/dev/null)
if make_root "$WORK/root" >"$WORK/image.log" 2>&1 &&
   img_made=$(tar -C "$WORK/root" --numeric-owner -cf - . |
     docker import --change 'USER 10001:10001' --change 'WORKDIR /data' \
       --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
       --change 'CMD ["tessera", "--help"]' - "$IMG" 2>>"$WORK/image.log"); then
  ok "image $IMG from the build's binaries ($(du -sm "$WORK/root" | cut -f1) MB)"
else
  cat "$WORK/image.log"
  bad "image $IMG from the build's binaries"
  exit 1
fi
rm -rf "$WORK/root"
runs() { docker run --rm "$IMG" "$1" --help >/dev/null 2>>"$WORK/image.log"; }
for b in tessera tessera-ps tessera-worker tessera-chief; do
  check "image: $b runs (--help)" runs "$b"
done
check "image: runs as 10001:10001" test "$(docker image inspect -f '{{.Config.User}}' "$IMG")" = 10001:10001
echo "TIME image $((SECONDS - t)) s"

# ---- the stack ---------------------------------------------------------------------
"$SRC/deploy/docker/token.sh" "$WORK/token" >/dev/null || bad "token.sh makes a token"
t=$SECONDS
stack_swarm "$IMG"
case $? in
  0) echo "TIME swarm $((SECONDS - t)) s"
     stack_runs
     stack_leave ;;
  77) [ "$fail" = 0 ] || exit 1
      echo "SKIP: $STACK_WHY; deploy_stack did not run the stack"
      exit 77 ;;
  *) exit 1 ;;
esac

# ---- the host's networking ------------------------------------------------------------
img_back
engine_end "$NET_BEFORE"
