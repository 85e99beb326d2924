#!/usr/bin/env bash
# Build the lab's Debian 12 base image locally (no outside registry is reachable): mmdebstrap + docker import.
set -euo pipefail
IMAGE=${1:-modelfleet-lab/base:bookworm}
if docker image inspect "$IMAGE" >/dev/null 2>&1; then echo "$IMAGE present"; exit 0; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mmdebstrap --variant=minbase \
  --include=python3,openssh-server,systemd,systemd-sysv,sudo,iproute2,curl,ca-certificates,procps \
  bookworm "$work/rootfs.tar"
docker import --change 'CMD ["/sbin/init"]' "$work/rootfs.tar" "$IMAGE"
