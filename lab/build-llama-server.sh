#!/usr/bin/env bash
# Build the lab's real llama.cpp server image locally: Debian's llama.cpp-tools (llama-server 0.7.0, built by
# Debian from the source release; in forky and sid, not yet in a stable release) with mmdebstrap, then docker
# import. /app/llama-server is where the upstream server images keep it, so the unit's entrypoint is the same.
# The archive's Release files carry a Valid-Until that a clock past it would reject: signatures are still checked.
set -euo pipefail
IMAGE=${1:?usage: build-llama-server.sh IMAGE, tagged with the hash of this script by modelfleet lab}
if docker image inspect "$IMAGE" >/dev/null 2>&1; then echo "$IMAGE present"; exit 0; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mmdebstrap --variant=minbase --aptopt='Acquire::Check-Valid-Until "false"' \
  --include=llama.cpp-tools,ca-certificates,curl \
  --customize-hook='mkdir -p "$1"/app && ln -s /usr/bin/llama-server "$1"/app/llama-server' \
  --customize-hook='rm -f "$1"/etc/apt/sources.list "$1"/etc/apt/sources.list.d/*' \
  forky "$work/rootfs.tar" http://deb.debian.org/debian
docker import --change 'ENTRYPOINT ["/app/llama-server"]' "$work/rootfs.tar" "$IMAGE"
