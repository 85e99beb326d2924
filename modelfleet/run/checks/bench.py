"""Acceptance bench: concurrent streaming chat requests; TTFT, TPOT, ITL, E2EL and throughputs as `vllm bench
serve` defines them; /metrics scraped during each level; JSON, a PNG plot, and regressions against the
previous result for the same endpoint.

Definitions (vLLM benchmarks/serve): TTFT = first streamed token - request sent; TPOT = (E2EL - TTFT) /
(output tokens - 1); ITL = gaps between successive streamed chunks; request throughput = completed /
duration; output throughput = output tokens / duration. Output tokens come from the server's `usage`
(stream_options.include_usage). Threads rather than asyncio: the CLI may run under pyinfra's gevent patches.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from openai import APIError, OpenAI

from modelfleet.base import masking
from modelfleet.base.grammar import slug
from modelfleet.base.host_commands import gpu_memory_sh, parse_gpu_memory
from modelfleet.host import ssh
from modelfleet.plan.catalog import EngineMetrics, load_catalog
from modelfleet.run.checks import Endpoint
from modelfleet.run.checks.probe import client

# Each engine's /metrics series (queue depth, KV-cache use, prefix-cache hits) are its `metrics` in
# catalog/engines.yaml.
# Regression thresholds against the previous result at the same concurrency.
WORSE_TTFT_P99 = 1.20
WORSE_OUTPUT_THROUGHPUT = 0.90


@dataclass
class RequestResult:
    task: int
    attempt: int
    ok: bool
    ttft_s: float = 0.0
    e2el_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    error: str | None = None


def _prompt(input_len: int, task: int) -> str:
    # A distinct first word per task keeps prefix caching from turning the bench into a cache test.
    return f"task{task} " + " ".join(["lorem"] * max(0, input_len - 1))


def one_request(api: OpenAI, ep: Endpoint, task: int, attempt: int, input_len: int,
                output_len: int) -> RequestResult:
    result = RequestResult(task=task, attempt=attempt, ok=False)
    sent = time.perf_counter()
    last = None
    try:
        stream = api.chat.completions.create(
            model=ep.model, messages=[{"role": "user", "content": _prompt(input_len, task)}], max_tokens=output_len,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        for chunk in stream:
            if chunk.usage:
                result.prompt_tokens = chunk.usage.prompt_tokens
                result.output_tokens = chunk.usage.completion_tokens
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta.model_dump()
            if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
                now = time.perf_counter()
                if last is None:
                    result.ttft_s = now - sent
                else:
                    result.itl_s.append(now - last)
                last = now
        result.e2el_s = time.perf_counter() - sent
        result.ok = last is not None
        if not result.ok:
            result.error = "stream ended without a token"
        if not result.output_tokens:
            result.output_tokens = len(result.itl_s) + (1 if result.ok else 0)
    except (APIError, OSError) as error:
        result.error = f"{type(error).__name__}: {error}"
    return result


def _stats(values: list[float]) -> dict:
    if not values:
        return {"mean_ms": None, "median_ms": None, "p99_ms": None}
    # Linear interpolation between closest ranks, as numpy.percentile (what vllm bench serve reports).
    p99 = statistics.quantiles(values, n=100, method="inclusive")[98] if len(values) > 1 else values[0]
    return {"mean_ms": round(1000 * statistics.fmean(values), 3),
            "median_ms": round(1000 * statistics.median(values), 3),
            "p99_ms": round(1000 * p99, 3)}


def _parse_metrics(text: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+([-+0-9.eE]+|NaN)$", line.strip())
        if m and not line.startswith("#"):
            values[m.group(1)] = values.get(m.group(1), 0.0) + float(m.group(3))
    return values


def engine_metrics(engine: str) -> EngineMetrics | None:
    """The series the bench samples for `engine` (catalog/engines.yaml); None for an endpoint whose engine the
    catalog does not know (a --base-url bench): nothing of it is measured."""
    entry = load_catalog().engines.get(engine)
    return entry.metrics if entry else None


class MetricsScraper(threading.Thread):
    """Samples the engine's /metrics while a level runs: peak and mean queue depth and KV use, prefix hits."""

    def __init__(self, ep: Endpoint, interval_s: float = 0.5):
        super().__init__(daemon=True)
        self.ep, self.interval_s, self.samples = ep, interval_s, []
        self.names = engine_metrics(ep.engine)
        self.done = threading.Event()

    def run(self):
        while self.names not in (None, EngineMetrics()) and not self.done.is_set():
            try:
                # llama-server keys /metrics too; the key goes in a header, never in a URL or argv.
                headers = {"Authorization": f"Bearer {self.ep.api_key}"} if self.ep.api_key else {}
                request = urllib.request.Request(f"{self.ep.base_url}/metrics", headers=headers)
                with urllib.request.urlopen(request, timeout=5) as response:
                    self.samples.append(_parse_metrics(response.read().decode()))
            except OSError:
                pass
            self.done.wait(self.interval_s)

    def summary(self) -> dict | None:
        names = self.names
        if names is None or names == EngineMetrics():
            why = ("not an engine of the catalog" if names is None
                   else "its catalog entry names no /metrics series")
            return {"not_measured": f"engine {self.ep.engine}: {why}"}
        if not self.samples:
            return None
        out = {}
        for key in ("queue", "kv"):
            series = [s[getattr(names, key)] for s in self.samples if getattr(names, key) in s]
            if series:
                out[f"{key}_max"], out[f"{key}_mean"] = max(series), round(statistics.fmean(series), 4)
        if names.prefix_hits:
            first, last = self.samples[0], self.samples[-1]
            queries = last.get(names.prefix_queries, 0) - first.get(names.prefix_queries, 0)
            out["prefix_cache_hit_rate"] = round((last.get(names.prefix_hits, 0) - first.get(names.prefix_hits, 0))
                                                 / queries, 4) if queries else None
        elif names.prefix_hit_rate:
            out["prefix_cache_hit_rate"] = self.samples[-1].get(names.prefix_hit_rate)
        out["samples"] = len(self.samples)
        return out


class GpuMemorySampler(threading.Thread):
    """Samples the serving host's GPU memory for the whole bench (one sampler per host): `read` runs
    gpu_memory_sh() there and returns its output. Peaks per GPU, for the run and for each level."""

    def __init__(self, read, interval_s: float = 0.5):
        super().__init__(daemon=True)
        self.read, self.interval_s = read, interval_s
        self.samples: list[tuple[float, dict[int, int]]] = []
        self.errors: list[str] = []
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            try:
                used = parse_gpu_memory(self.read())
                if used:
                    self.samples.append((time.perf_counter(), used))
            except Exception as error:  # a failed read leaves a gap, never stops the bench
                if len(self.errors) < 5:
                    self.errors.append(f"{type(error).__name__}: {error}")
            self.done.wait(self.interval_s)

    def stop(self) -> None:
        self.done.set()
        self.join()

    def summary(self, start: float | None = None, end: float | None = None) -> dict | None:
        window = [used for t, used in self.samples if (start is None or t >= start) and (end is None or t <= end)]
        if not window:
            return {"samples": 0, "errors": self.errors} if self.errors else None
        gpus = sorted({i for used in window for i in used})
        return {"samples": len(window), "interval_s": self.interval_s,
                "peak_mib": {str(i): max(u[i] for u in window if i in u) for i in gpus},
                "mean_mib": {str(i): round(statistics.fmean(u[i] for u in window if i in u), 1) for i in gpus},
                **({"errors": self.errors} if self.errors else {})}


def host_gpu_memory(plan):
    """A `gpu_memory` reader for the bench of a service on `plan`'s host, over the same SSH path as `modelfleet
    status` (a local command for @local); None where there is nothing to read (no NVIDIA GPUs)."""
    if plan.hardware.vendor != "nvidia":
        return None
    if plan.address == "@local":
        return lambda: subprocess.run(gpu_memory_sh(), shell=True, capture_output=True, text=True,
                                      timeout=10).stdout
    conn = ssh.connect(plan)
    return lambda: ssh.execute(conn, plan, gpu_memory_sh())[1]


def run_level(ep: Endpoint, concurrency: int, num_prompts: int, input_len: int, output_len: int,
              retries: int = 0, scrape: bool = True) -> dict:
    scraper = MetricsScraper(ep) if scrape else None
    if scraper:
        scraper.start()
    results: list[RequestResult] = []
    lock = threading.Lock()
    api = client(ep, timeout_s=600)  # one connection pool per level, as vllm bench shares one session

    def task(n: int) -> None:
        for attempt in range(retries + 1):
            r = one_request(api, ep, n, attempt, input_len, output_len)
            with lock:
                results.append(r)
            if r.ok:
                return

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(task, range(num_prompts)))
    duration = time.perf_counter() - start
    if scraper:
        scraper.done.set()
        scraper.join()
    good = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in good)
    return {
        "concurrency": concurrency, "num_prompts": num_prompts, "duration_s": round(duration, 4),
        "completed": len(good), "failed_attempts": len(results) - len(good),
        "successful_tasks": len({r.task for r in good}), "attempts": len(results),
        "total_input_tokens": sum(r.prompt_tokens for r in results),
        "total_output_tokens": sum(r.output_tokens for r in results),
        "request_throughput": round(len(good) / duration, 4),
        "output_throughput": round(output_tokens / duration, 3),
        "total_token_throughput": round((output_tokens + sum(r.prompt_tokens for r in good)) / duration, 3),
        "ttft": _stats([r.ttft_s for r in good]),
        "tpot": _stats([(r.e2el_s - r.ttft_s) / (r.output_tokens - 1) for r in good if r.output_tokens > 1]),
        "itl": _stats([gap for r in good for gap in r.itl_s]),
        "e2el": _stats([r.e2el_s for r in good]),
        "errors": sorted({r.error for r in results if r.error})[:10],
        "metrics": scraper.summary() if scraper else None,
    }


def regressions(current: dict, previous: dict | None) -> list[str]:
    """Levels whose TTFT p99 rose by more than 20 % or output throughput fell by more than 10 %."""
    if not previous:
        return []
    before = {level["concurrency"]: level for level in previous.get("levels", [])}
    flags = []
    for level in current["levels"]:
        old = before.get(level["concurrency"])
        if not old:
            continue
        c = level["concurrency"]
        if old["ttft"]["p99_ms"] and level["ttft"]["p99_ms"] and \
                level["ttft"]["p99_ms"] > WORSE_TTFT_P99 * old["ttft"]["p99_ms"]:
            flags.append(f"concurrency {c}: TTFT p99 {level['ttft']['p99_ms']} ms vs {old['ttft']['p99_ms']} ms before")
        if old["output_throughput"] and level["output_throughput"] < WORSE_OUTPUT_THROUGHPUT * old["output_throughput"]:
            flags.append(f"concurrency {c}: output {level['output_throughput']} tok/s vs "
                         f"{old['output_throughput']} tok/s before")
        if level["failed_attempts"] > old["failed_attempts"]:
            flags.append(f"concurrency {c}: {level['failed_attempts']} failed attempts vs {old['failed_attempts']}")
    return flags


def plot(result: dict, path: Path) -> None:
    """Latency percentiles (TTFT, TPOT, ITL: median and p99) against concurrency."""
    # matplotlib (slow to import) loads only to draw a plot
    import matplotlib

    matplotlib.use("Agg")
    # after use(): pyplot takes its backend when it loads
    import matplotlib.pyplot as plt

    levels = result["levels"]
    xs = [lv["concurrency"] for lv in levels]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for metric, color in (("ttft", "tab:blue"), ("tpot", "tab:orange"), ("itl", "tab:green")):
        for pct, style in (("median_ms", "-o"), ("p99_ms", "--^")):
            ys = [lv[metric][pct] for lv in levels]
            if any(y is not None for y in ys):
                ax.plot(xs, ys, style, color=color, label=f"{metric.upper()} {pct.split('_')[0]}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrency")
    ax.set_ylabel("latency (ms)")
    title = f"{result['endpoint']} ({result['model']}), in {result['input_len']} / out {result['output_len']}"
    peaks = (result.get("gpu_memory") or {}).get("peak_mib")
    if peaks:
        title += "\npeak GPU memory: " + ", ".join(f"GPU {i} {mib} MiB" for i, mib in peaks.items())
    ax.set_title(title, fontsize=9 if peaks else None)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def bench(ep: Endpoint, concurrencies: list[int], num_prompts: int, input_len: int, output_len: int,
          out_dir: Path, retries: int = 0, scrape: bool = True, progress=None, gpu_memory=None) -> dict:
    """Run every level, write <out_dir>/<endpoint>/bench-<time>.json + .png and latest.json; compare.
    `gpu_memory`: reads the serving host's gpu_memory_sh() output; its peaks per GPU go into each level."""
    sampler = GpuMemorySampler(gpu_memory) if gpu_memory else None
    if sampler:
        sampler.start()
    levels = []
    try:
        for c in concurrencies:
            start = time.perf_counter()
            levels.append(run_level(ep, c, num_prompts, input_len, output_len, retries, scrape))
            if sampler:
                levels[-1]["gpu_memory"] = sampler.summary(start, time.perf_counter())
            if progress:
                progress(levels[-1])
    finally:
        if sampler:
            sampler.stop()
    result = {"endpoint": ep.name, "base_url": ep.openai_base_url, "model": ep.model, "engine": ep.engine,
              "input_len": input_len, "output_len": output_len, "retries": retries,
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "levels": levels,
              "gpu_memory": sampler.summary() if sampler else None,
              "definitions": "vllm bench serve (TTFT, TPOT, ITL, E2EL; throughputs over the level's duration)"}
    folder = out_dir / slug(ep.name)
    folder.mkdir(parents=True, exist_ok=True)
    latest = folder / "latest.json"
    previous = json.loads(latest.read_text()) if latest.exists() else None
    result["regressions"] = regressions(result, previous)
    result["compared_with"] = previous["started"] if previous else None
    stamp = result["started"].replace(":", "")
    result["json"], result["plot"] = str(folder / f"bench-{stamp}.json"), str(folder / f"bench-{stamp}.png")
    plot(result, Path(result["plot"]))
    text = masking.mask(json.dumps(masking.masked(result), indent=2)) + "\n"
    Path(result["json"]).write_text(text)
    latest.write_text(text)
    return result


