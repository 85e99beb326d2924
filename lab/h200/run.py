"""llama.cpp on a real GPU host, driven by modelfleet's own code: for each recipe in recipes/ beside this file,
resolve a one-host inventory (`@local`, h200), render the engine's argument list (modelfleet.plan.render.engine_argv),
start llama-server with exactly that list, then run the verify gate (readiness, smoke, tool-call probe) and the
bench with the host's GPU memory sampled, and put the planner's prediction for the same recipe beside it.

The model is lab/tiny_gguf.py's mixture-of-experts GGUF (random weights), so the runs say how the engine, the
offload flags and the checks behave on the GPU, not how a real model performs. Run on the GPU host:
    python3 lab/h200/run.py --server build/bin/llama-server --out OUT
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from lab import tiny_gguf  # noqa: E402
from modelfleet.plan import render  # noqa: E402
from modelfleet.plan.catalog import Model, load_catalog, with_site_recipes  # noqa: E402
from modelfleet.plan.inventory import resolve  # noqa: E402
from modelfleet.plan.planner import plan_capacity, split_lines  # noqa: E402
from modelfleet.run.checks import endpoint  # noqa: E402
from modelfleet.run.checks.bench import bench, gpu_memory_sh, parse_gpu_memory  # noqa: E402
from modelfleet.run.checks.probe import verify  # noqa: E402

EXPERTS, EXPERTS_USED, EXPERT_FFN = 64, 2, 16384


def gguf_model(path: Path) -> Model:
    """The catalog entry of the generated GGUF, from its own tensors (total, routed-expert and active params)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    total = sum(int(t.n_elements) for t in reader.tensors)
    routed = sum(int(t.n_elements) for t in reader.tensors if "_exps." in t.name)
    return Model(id="tiny-moe", hf_repo="modelfleet/tiny-moe", source="lab/tiny_gguf.py (random weights)",
                 architecture="moe", params_total=total, params_active=total - routed + routed * EXPERTS_USED / EXPERTS,
                 layers=tiny_gguf.LAYERS, experts={"routed": EXPERTS, "selected_per_token": EXPERTS_USED, "shared": 0},
                 context_max=tiny_gguf.CONTEXT, modalities=["text"], weights="fp32",
                 gguf={"repo": "modelfleet/tiny-moe", "memory_overhead": 0.15, "quants": {"F32": path.stat().st_size}})


def gpu_memory() -> str:
    return subprocess.run(gpu_memory_sh(), shell=True, capture_output=True, text=True, timeout=10).stdout


def host_ram_gib() -> int:
    with open("/proc/meminfo") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    return kib // 2**20


def one_run(server: str, recipe_id: str, catalog, out: Path) -> dict:
    inventory = [("@local", {"hardware": "h200", "gpu_count": 1, "model": "tiny-moe", "engine": "llama.cpp",
                             "recipe": recipe_id, "pool": "tiny-moe", "host_ram_gib": host_ram_gib()})]
    resolved = resolve(inventory, catalog)
    if resolved.errors:
        return {"recipe": recipe_id, "ok": False, "errors": resolved.error_lines()}
    plan = resolved.hosts["@local"]
    svc = plan.services[0]
    argv = render.engine_argv(svc)
    report = plan_capacity(svc.model, svc.hardware, gpus=svc.gpus, recipe=svc.recipe, host_ram_gib=plan.host_ram_gib)
    idle = parse_gpu_memory(gpu_memory())
    log = out / f"llama-server-{recipe_id}.log"
    print(f"== {recipe_id}: {server} {' '.join(argv)}", flush=True)
    with open(log, "w") as sink:
        proc = subprocess.Popen([server, *argv], stdout=sink, stderr=subprocess.STDOUT)
        try:
            ep = endpoint(plan, svc)
            started = time.perf_counter()
            gate = verify(ep, ready_timeout_s=svc.recipe.ready_timeout_s, full=True)
            loaded = parse_gpu_memory(gpu_memory())
            print(f"verify ok={gate['ok']} after {time.perf_counter() - started:.1f} s", flush=True)
            result = bench(ep, [1, 4], num_prompts=16, input_len=128, output_len=64, out_dir=Path("/tmp/bench"),
                           gpu_memory=gpu_memory) if gate["ok"] else None
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    levels = [{k: lv[k] for k in ("concurrency", "completed", "failed_attempts", "output_throughput", "ttft",
                                  "tpot", "itl", "gpu_memory", "metrics")} for lv in (result or {}).get("levels", [])]
    return {"recipe": recipe_id, "argv": argv, "ok": gate["ok"], "verify": gate,
            "gpu_memory_idle_mib": idle, "gpu_memory_loaded_mib": loaded,
            "bench": {"levels": levels, "gpu_memory": result["gpu_memory"]} if result else None,
            "planner": {"fits": report.fits, "reason": report.reason, "split": split_lines(report),
                        "weights_per_gpu_bytes": report.weights_per_gpu_bytes,
                        "usable_per_gpu_bytes": report.usable_per_gpu_bytes, "offload": report.offload}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    model_dir = Path("/srv/tiny-moe")
    model_dir.mkdir(parents=True, exist_ok=True)
    gguf_path = tiny_gguf.write(model_dir / "tiny-moe.gguf", experts=EXPERTS, experts_used=EXPERTS_USED,
                                expert_ffn=EXPERT_FFN)
    # The rendered argument list names the model as the container sees it (/model/<file>).
    if not os.path.exists(render.CONTAINER_MODEL_DIR):
        os.symlink(model_dir, render.CONTAINER_MODEL_DIR)
    model = gguf_model(gguf_path)
    base = load_catalog()
    catalog = with_site_recipes(base.model_copy(update={"models": {**base.models, model.id: model}}),
                                HERE / "recipes")
    runs = [one_run(args.server, recipe_id, catalog, args.out)
            for recipe_id in ("tiny-moe-h200-gpu", "tiny-moe-h200-cpu-moe")]
    version = subprocess.run([args.server, "--version"], capture_output=True, text=True)
    summary = {"gguf": {"path": str(gguf_path), "bytes": gguf_path.stat().st_size,
                        "params_total": model.params_total, "params_active": model.params_active,
                        "experts": EXPERTS, "experts_used": EXPERTS_USED, "expert_ffn": EXPERT_FFN},
               "server_version": (version.stdout + version.stderr).strip(), "host_ram_gib": host_ram_gib(),
               "gpu": subprocess.run("nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader",
                                     shell=True, capture_output=True, text=True).stdout.strip(),
               "runs": runs}
    (args.out / "results.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(json.dumps([{k: r.get(k) for k in ("recipe", "ok")} for r in runs]), flush=True)


if __name__ == "__main__":
    main()
