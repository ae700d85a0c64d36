#!/usr/bin/env bash
# Makes the base images deploy/Dockerfile starts from, debian:12 and
# debian:12-slim, available to the engine at DOCKER_HOST (engine.sh).
#
#   deploy/docker/base-image.sh        (inside `engine.sh run`, or with
#                                       DOCKER_HOST set)
#
# Happy path: both are there already (nothing to do), or the registry gives
# them (docker pull). Without a registry: debootstrap --variant=minbase
# bookworm from the mirror this machine's apt uses, with this machine's apt
# sources, keys and settings copied in (a dated snapshot mirror needs them:
# Acquire::Check-Valid-Until and the like), trimmed as Debian's slim images
# are (no docs, man pages or locales; apt keeps no .debs), packed once into
# $TSR_DOCKER_CACHE/debian-12-minbase.tar.gz and imported under both names.
# A later run imports the tarball (seconds) instead of bootstrapping again.
#
# Failure modes: no debootstrap and no way to install it, a mirror that
# cannot be reached, an import that fails: each stops with a message and
# status 1, and no half-made tarball is left in the cache.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/engine.sh"

have() { docker image inspect "$1" >/dev/null 2>&1; }

if have debian:12 && have debian:12-slim; then
  tsr_dk_say "base images debian:12 and debian:12-slim are present"
  exit 0
fi
if timeout 120 docker pull -q debian:12 >/dev/null 2>&1 &&
   timeout 120 docker pull -q debian:12-slim >/dev/null 2>&1; then
  tsr_dk_say "pulled debian:12 and debian:12-slim"
  exit 0
fi
tsr_dk_say "no registry: making debian:12 from debootstrap"

tarball="$TSR_DOCKER_CACHE/debian-12-minbase.tar.gz"
if [ ! -s "$tarball" ]; then
  command -v debootstrap >/dev/null 2>&1 || {
    tsr_dk_say "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive tsr_dk_sudo apt-get install -y -qq \
      --no-install-recommends debootstrap >/dev/null
  }
  # the mirror apt uses here for bookworm itself
  mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(TARGET_OF)' |
           awk '$2 == "bookworm" && $3 == "deb" {print $1; exit}')
  mirror=${mirror:-http://deb.debian.org/debian/}
  work=$(mktemp -d "${TMPDIR:-/tmp}/tsr-rootfs.XXXXXX")
  trap 'rm -rf "$work" "$tarball.part"' EXIT
  rootfs="$work/rootfs"
  tsr_dk_say "debootstrap --variant=minbase bookworm from $mirror"
  if ! debootstrap --variant=minbase bookworm "$rootfs" "$mirror" \
       >"$work/debootstrap.log" 2>&1; then
    tail -n 20 "$work/debootstrap.log" >&2
    tsr_dk_say "debootstrap failed"; exit 1
  fi
  # this machine's apt sources, keys and settings (not its hooks, which
  # call programs the image does not have)
  rm -f "$rootfs/etc/apt/sources.list"
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
           /etc/apt/sources.list.d/*.sources; do
    [ -s "$f" ] && cp "$f" "$rootfs$f"
  done
  for f in /etc/apt/apt.conf /etc/apt/apt.conf.d/*; do
    [ -f "$f" ] && ! grep -q 'Invoke' "$f" && cp "$f" "$rootfs$f"
  done
  for d in /etc/apt/trusted.gpg.d /etc/apt/keyrings; do
    [ -d "$d" ] && mkdir -p "$rootfs$d" && cp -a "$d/." "$rootfs$d/"
  done
  for k in $(sed -n 's/^ *Signed-By: *//p; s/.*signed-by=\([^] ]*\).*/\1/p' \
             /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null | sort -u); do
    case "$k" in /*) [ -f "$k" ] && [ ! -e "$rootfs$k" ] &&
      { mkdir -p "$(dirname "$rootfs$k")"; cp "$k" "$rootfs$k"; } ;; esac
  done
  # slim, as Debian's -slim images: dpkg leaves out docs, man pages and
  # locales; apt keeps no downloaded packages and no translations
  cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
CFG
  cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'CFG'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
CFG
  echo 'Acquire::Languages "none";' >"$rootfs/etc/apt/apt.conf.d/docker-no-languages"
  echo 'APT::Install-Recommends "false";' >"$rootfs/etc/apt/apt.conf.d/docker-no-recommends"
  find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  rm -rf "$rootfs"/usr/share/{man,info,groff,lintian,linda,locale}/*
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin \
         "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log "$rootfs"/tmp/*
  mkdir -p "$TSR_DOCKER_CACHE"
  tar --numeric-owner -C "$rootfs" -c . | gzip -1 >"$tarball.part"
  mv "$tarball.part" "$tarball"
  tsr_dk_say "base tarball: $tarball ($(du -h "$tarball" | cut -f1))"
fi
docker import -c 'CMD ["bash"]' "$tarball" debian:12 >/dev/null
docker tag debian:12 debian:12-slim
tsr_dk_say "imported debian:12 and debian:12-slim from $tarball"
