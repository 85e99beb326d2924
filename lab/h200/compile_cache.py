"""What a warm engine cache is worth on a real GPU, with the copy modelfleet makes of it between peers:

    python3 lab/h200/compile_cache.py --out OUT [--runs 3]

A model small enough to carry (six TransformerEncoderLayer(1024, 16 heads) in fp16) is compiled with
torch.compile, each run in a fresh process, with the cache roots an engine container gets (TORCHINDUCTOR_CACHE_DIR
and TRITON_CACHE_DIR under one directory, as modelfleet mounts /cache):
  cold  an empty directory;
  warm  a directory filled the way a joining peer's is: the first cold run's directory indexed by the fetch script
        (`modelfleet_fetch.py index`), served by its peer server on loopback, and copied by its receiver, every
        file checked against the index.
Cold and warm runs alternate. Each run reports the first call (compile and run), its process's setup (imports,
CUDA start, the model) and its wall time. Everything goes to OUT/compile-cache.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

FETCH = Path(__file__).resolve().parents[2] / "modelfleet" / "files" / "modelfleet_fetch.py"


def child(root: str) -> None:
    start = time.perf_counter()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{root}/inductor"
    os.environ["TRITON_CACHE_DIR"] = f"{root}/triton"
    import torch

    torch.manual_seed(0)
    layers = [torch.nn.TransformerEncoderLayer(1024, 16, 4096, batch_first=True) for _ in range(6)]
    model = torch.nn.Sequential(*layers).cuda().half().eval()
    x = torch.randn(8, 256, 1024, device="cuda", dtype=torch.half)
    compiled = torch.compile(model)
    torch.cuda.synchronize()
    setup = time.perf_counter() - start
    with torch.no_grad():
        first = time.perf_counter()
        compiled(x)
        torch.cuda.synchronize()
        first_call = time.perf_counter() - first
        steady = time.perf_counter()
        for _ in range(20):
            compiled(x)
        torch.cuda.synchronize()
    print(json.dumps({"setup_s": round(setup, 3), "first_call_s": round(first_call, 3),
                      "steady_ms": round((time.perf_counter() - steady) / 20 * 1000, 3), "torch": torch.__version__}))


def run_child(root: Path) -> dict:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "child", str(root)], capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["wall_s"] = round(time.perf_counter() - start, 3)
    return result


def tree_bytes(root: Path) -> tuple[int, int]:
    files = [p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".modelfleet-")]
    return len(files), sum(p.stat().st_size for p in files)


def main() -> int:
    if sys.argv[1:2] == ["child"]:
        child(sys.argv[2])
        return 0
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    work = Path("/tmp/compile-cache")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    result: dict = {"cold": [], "warm": [], "copies": []}
    seed = work / "seed"
    result["cold"].append(run_child(seed))  # the first cold run fills the seed, as a pool's first member's
    indexed = subprocess.run([sys.executable, str(FETCH), "index", str(seed), "engine-cache/bench"],
                             capture_output=True, text=True, check=True)
    result["index"] = json.loads(indexed.stdout)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, str(FETCH), "serve", str(seed), "127.0.0.1", str(port)],
                              stderr=subprocess.DEVNULL)
    time.sleep(1)
    try:
        for i in range(args.runs):
            if i:
                result["cold"].append(run_child(work / f"cold-{i}"))
            dest = work / f"warm-{i}"
            job = work / f"job-{i}.json"
            job.write_text(json.dumps({"repo": "engine-cache/bench", "commit": "bench", "endpoint": None,
                                       "dest": str(dest), "token_file": None, "files": None}))
            start = time.perf_counter()
            copied = subprocess.run([sys.executable, str(FETCH), str(job), "peer", f"http://127.0.0.1:{port}/"],
                                    capture_output=True, text=True)
            if copied.returncode:
                raise SystemExit(copied.stderr)
            result["copies"].append({"seconds": round(time.perf_counter() - start, 3), **json.loads(copied.stdout)})
            result["warm"].append(run_child(dest))
    finally:
        server.terminate()
    files, size = tree_bytes(seed)
    med = {kind: {k: statistics.median(r[k] for r in result[kind]) for k in ("first_call_s", "wall_s", "setup_s")}
           for kind in ("cold", "warm")}
    result.update(cache_files=files, cache_bytes=size, medians=med,
                  warm_over_cold_first_call=round(med["warm"]["first_call_s"] / med["cold"]["first_call_s"], 3),
                  warm_over_cold_wall=round(med["warm"]["wall_s"] / med["cold"]["wall_s"], 3),
                  gpu=subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                     capture_output=True, text=True).stdout.strip(),
                  date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    (args.out / "compile-cache.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("medians", "warm_over_cold_first_call", "warm_over_cold_wall",
                                             "cache_files", "cache_bytes")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
