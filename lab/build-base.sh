#!/usr/bin/env bash
# Build the lab's Debian 12 base image locally (no outside registry is reachable): mmdebstrap + docker import.
# No apt sources are left in the image: lab hosts may only reach loopback (bare hosts get the lab's archive).
set -euo pipefail
IMAGE=${1:?usage: build-base.sh IMAGE, tagged with the hash of this script by modelfleet lab}
if docker image inspect "$IMAGE" >/dev/null 2>&1; then echo "$IMAGE present"; exit 0; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mmdebstrap --variant=minbase \
  --include=python3,python3-venv,openssh-server,systemd,systemd-sysv,sudo,iproute2,curl,ca-certificates,procps \
  --include=xfsprogs,rsync \
  --customize-hook='rm -f "$1"/etc/apt/sources.list "$1"/etc/apt/sources.list.d/*' \
  bookworm "$work/rootfs.tar"
docker import --change 'CMD ["/sbin/init"]' "$work/rootfs.tar" "$IMAGE"
