#!/usr/bin/env bash
# On the GPU host: build llama-server (CUDA, sm_90) from the carried llama.cpp b11434 tree, record its --help,
# then lab/h200/run.py (modelfleet's rendered argv, verify gate, bench). Everything printed goes to $OUT/run.log.
set -uo pipefail
exec > >(tee -a "$OUT/run.log") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
date -u; nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv; nvcc --version | tail -2
grep -E 'MemTotal|MemAvailable' /proc/meminfo; nproc
mkdir -p /tmp/src && tar xJf .llama/llama.cpp-b11434.tar.xz -C /tmp/src || exit 1
start=$(date +%s)
cmake -S /tmp/src/llama.cpp -B /tmp/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/tmp/cmake.log 2>&1 \
  || { tail -40 /tmp/cmake.log; exit 1; }
cmake --build /tmp/build --target llama-server -j "$(nproc)" >/tmp/build.log 2>&1 || { tail -60 /tmp/build.log; exit 1; }
echo "build_s=$(( $(date +%s) - start ))"
/tmp/build/bin/llama-server --version
/tmp/build/bin/llama-server --help > "$OUT/llama-server-help-b11434.txt" 2>&1
python3 lab/h200/run.py --server /tmp/build/bin/llama-server --out "$OUT"
echo "rc=$?"
