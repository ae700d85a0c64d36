#!/usr/bin/env bash
# The compose cluster's token file, readable by the containers' uid 10001:
#
#   deploy/docker/token.sh [FILE]        make FILE (default deploy/token)
#                                        unless it exists; check it
#   deploy/docker/token.sh --check FILE  only check it
#
# Compose bind-mounts the file as it is, so its owner and mode decide who
# reads it: as root this makes it mode 0600 owned by 10001:10001; without
# root, mode 0644 (the processes run as 10001, not as you). An existing
# file is left as it is and checked: one that uid 10001 cannot read (e.g.
# 0600 and owned by someone else) would stop every service with
# "Permission denied" and exit 2; the check says so and exits 1.
set -euo pipefail
uid=10001
check=0
if [ "${1:-}" = --check ]; then check=1; shift; fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
file=${1:-$root/deploy/token}

if [ ! -e "$file" ]; then
  [ "$check" = 1 ] && { echo "token.sh: $file does not exist" >&2; exit 1; }
  ( umask 077; head -c 32 /dev/urandom | base64 >"$file" )
  if [ "$(id -u)" = 0 ]; then
    chown "$uid:$uid" "$file"; chmod 0600 "$file"
  else
    chmod 0644 "$file"
  fi
  echo "token.sh: made $file"
fi

owner=$(stat -c %u "$file")
mode=$(stat -c %a "$file")
# readable by 10001: as its owner, or by everyone (a group match is not
# assumed: the container's groups are 10001's own)
if { [ "$owner" = "$uid" ] && [ $((8#$mode & 8#400)) != 0 ]; } ||
   [ $((8#$mode & 8#004)) != 0 ]; then
  echo "token.sh: $file (owner $owner, mode $mode) is readable by uid $uid"
  exit 0
fi
echo "token.sh: $file (owner $owner, mode $mode) cannot be read by uid $uid," \
     "as which every Tessera container runs: chmod 0644 $file," \
     "or chown $uid $file" >&2
exit 1
