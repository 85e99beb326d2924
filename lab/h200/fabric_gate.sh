#!/usr/bin/env bash
# On the GPU host: lab/h200/fabric_gate.py (the fabric fact, the fabric derived for the host as a one-host pool,
# the netcheck gate's script and judgement, the reachability check). Everything printed goes to $OUT/run.log.
# The host has no network: .whl/ (ignored by git, carried beside the working tree) holds cp312 manylinux wheels of
# requirements.lock's versions the host's python3 lacks (pyinfra and its needs, pydantic).
set -uo pipefail
exec > >(tee -a "$OUT/run.log") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
python3 lab/h200/fabric_gate.py --out "$OUT"
rc=$?
echo "rc=$rc"
exit $rc
