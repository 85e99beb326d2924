#!/usr/bin/env python3
"""Engine double for the lab: an OpenAI-compatible server started with the real engines' command lines.

Invoked as `vllm serve MODEL ...`, `sglang serve --model-path MODEL ...` or `llama-server --model FILE ...`
(argv[0] says which engine it plays). Flags the played engine does not document are refused, as the real
engine would refuse them. Stdlib only: the image needs nothing but python3.

Fault switches (environment, for tests): MODELFLEET_DOUBLE_LOAD_DELAY_S (503 on /health meanwhile),
MODELFLEET_DOUBLE_NEVER_READY=1, MODELFLEET_DOUBLE_CRASH_AFTER=N (exit after N chat requests),
MODELFLEET_DOUBLE_SLOW_FIRST_TOKEN_S, MODELFLEET_DOUBLE_MALFORMED_TOOL_CALLS=1 (raw markup in content).
The lab's "-broken" image tags have MODELFLEET_DOUBLE_NEVER_READY=1 baked in.
MODELFLEET_DOUBLE_TOKEN_INTERVAL_S paces streamed tokens (default 0.002 s), so a bench has something to measure.
MODELFLEET_DOUBLE_VERSION: the image version the replica says it runs, as every chat reply's `system_fingerprint`
(the field llama-server fills with its build), so a rolling upgrade can tell which replicas run the new one.
The API key covers what the played engine's key covers (KEY_FREE; modelfleet/plan/catalog/key_coverage.yaml names
the sources): vLLM's only the /v1, /v2 and /inference routes, so its /invocations runs the model without a key;
SGLang's every route but /health*, /ready* and /metrics*; llama-server's every route but its public ones. Each
engine's own non-/v1 inference route is served too (NATIVE_ROUTES).
As vLLM, with VLLM_CACHE_ROOT set (modelfleet's mounted engine cache), it compiles on its first start
(MODELFLEET_DOUBLE_COMPILE_S, default 1 s) and writes its artifacts under the cache roots, and on a later start
with the same flags loads them instead; it says which in vLLM's own log lines, which the boot timeline reads.
Like the Kimi chat templates, a tool result is refused (400) unless the assistant turn before it came back
whole: its tool_calls and its reasoning_content.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# The engines' recorded flag lists (modelfleet/plan/catalog/engine_flags.json): copied beside the double in its image,
# read from the checkout's catalog otherwise.
_FLAGS_FILE = Path(__file__).resolve().parent / "flags.json"
if not _FLAGS_FILE.exists():
    _FLAGS_FILE = Path(__file__).resolve().parents[2] / "modelfleet" / "plan" / "catalog" / "engine_flags.json"
FLAGS = json.loads(_FLAGS_FILE.read_text())
STARTED = time.time()
LOCK = threading.Lock()
COUNTERS = {"requests": 0, "prompt_tokens": 0, "generation_tokens": 0, "running": 0, "ttft_sum": 0.0,
            "ttft_count": 0}


# Which paths each engine serves without its key, as its code decides (a prefix or an exact path).
KEY_FREE = {
    "vllm": lambda path: not path.startswith(("/v1", "/v2", "/inference")),  # vllm/entrypoints/.../api_server
    "sglang": lambda path: path.startswith(("/health", "/ready", "/metrics")),  # srt/utils/auth.py
    "llama.cpp": lambda path: path in ("/health", "/v1/health", "/models", "/v1/models", "/"),  # server-http.cpp
    "tokenspeed": lambda path: True,  # modelfleet gives its gateway no key (catalog/engines.yaml)
    "ollama": lambda path: True,  # no server-side authentication (server/routes.go)
}
# Each engine's non-/v1 inference route: vLLM's SageMaker-style /invocations (a chat or a completion request),
# SGLang's native /generate, llama-server's /completion.
NATIVE_ROUTES = {"vllm": "/invocations", "sglang": "/generate", "llama.cpp": "/completion",
                 "tokenspeed": "/generate",  # TokenSpeed: its smg gateway's SGLang-style /generate
                 "ollama": "/api/generate"}


def engine_name() -> str:
    prog = Path(sys.argv[0]).name
    return {"vllm": "vllm", "sglang": "sglang", "llama-server": "llama.cpp"}.get(prog, prog)


def parse_args(engine: str, argv: list[str]) -> dict:
    spec = FLAGS[engine]["flags"]
    aliases = FLAGS[engine].get("aliases", {})
    args: dict = {"positional": []}
    if engine in ("vllm", "sglang", "tokenspeed"):
        if not argv or argv[0] != "serve":
            sys.exit(f"{engine}: expected the `serve` subcommand, got {argv[:1]}")
        argv = argv[1:]
    i = 0
    while i < len(argv):
        raw = argv[i]
        if not raw.startswith("-"):
            args["positional"].append(raw)
            i += 1
            continue
        name, eq, inline = raw.partition("=")
        name = aliases.get(name, name)
        if name not in spec:
            sys.exit(f"{engine}: error: unrecognized arguments: {raw}")
        if spec[name] == "bool":
            args[name] = True
            i += 1
        elif spec[name] == "values" and not eq:  # nargs="+": every value up to the next option; the first counts
            values = list(itertools.takewhile(lambda a: not a.startswith("-"), argv[i + 1:]))
            if not values:
                sys.exit(f"{engine}: error: argument {name}: expected at least one argument")
            args[name] = values[0]
            i += 1 + len(values)
        else:
            if eq:
                args[name] = inline
                i += 1
            elif i + 1 < len(argv):
                args[name] = argv[i + 1]
                i += 2
            else:
                sys.exit(f"{engine}: error: argument {name}: expected one argument")
    return args


class Engine:
    def __init__(self, engine: str, args: dict):
        self.engine = engine
        model = args.get("--model-path") or args.get("--model") or (args["positional"] or ["model"])[0]
        self.served = args.get("--served-model-name") or args.get("--alias") or model
        self.host = args.get("--host", "127.0.0.1")
        self.port = int(args.get("--port") or FLAGS[engine]["default_port"])
        self.api_key = self._api_key(args)
        self.load_delay = float(os.environ.get("MODELFLEET_DOUBLE_LOAD_DELAY_S", "1"))
        self.never_ready = os.environ.get("MODELFLEET_DOUBLE_NEVER_READY") == "1"
        self.crash_after = int(os.environ.get("MODELFLEET_DOUBLE_CRASH_AFTER", "0"))
        self.slow_first_token = float(os.environ.get("MODELFLEET_DOUBLE_SLOW_FIRST_TOKEN_S", "0"))
        self.malformed_tools = os.environ.get("MODELFLEET_DOUBLE_MALFORMED_TOOL_CALLS") == "1"
        self.token_interval = float(os.environ.get("MODELFLEET_DOUBLE_TOKEN_INTERVAL_S", "0.002"))
        self.version = os.environ.get("MODELFLEET_DOUBLE_VERSION")

    def _api_key(self, args: dict) -> str | None:
        if args.get("--api-key"):
            return args["--api-key"]
        if self.engine == "tokenspeed":
            return None  # `tokenspeed serve` hands --api-key to its gateway, which modelfleet never passes
        if self.engine == "sglang" and args.get("--config"):
            for line in Path(args["--config"]).read_text().splitlines():
                key, _, value = line.partition(":")
                if key.strip() == "api-key":
                    return value.strip().strip("'\"")
        env = {"vllm": "VLLM_API_KEY", "llama.cpp": "LLAMA_API_KEY"}.get(self.engine)
        return os.environ.get(env) if env else None

    def ready(self) -> bool:
        return not self.never_ready and time.time() - STARTED >= self.load_delay


def words(text) -> int:
    if isinstance(text, list):
        text = " ".join(part.get("text", "") for part in text if isinstance(part, dict))
    return max(1, len(str(text or "").split()))


def answer(eng: Engine, body: dict) -> dict:
    """The whole assistant turn: reasoning, then content or a tool call."""
    messages = body.get("messages", [])
    last = messages[-1] if messages else {}
    tools = body.get("tools") or []
    # A reasoning model, as the guides' vLLM/SGLang models are; the lab's GGUF (llama.cpp) has no reasoning.
    reasoning = (None if eng.engine == "llama.cpp"
                 else "The user asked something; the lab double answers deterministically.")
    if tools and last.get("role") == "user" and body.get("tool_choice") != "none":
        fn = tools[0]["function"]
        props = fn.get("parameters", {}).get("properties", {})
        arguments = {name: "Paris" if "city" in name or "location" in name else "lab" for name in props}
        if eng.malformed_tools:
            raw = f"<|tool_call_begin|>{fn['name']}<|tool_call_argument_begin|>{json.dumps(arguments)}"
            return {"reasoning": reasoning, "content": raw, "tool_calls": None, "finish": "stop"}
        call = {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                "function": {"name": fn["name"], "arguments": json.dumps(arguments)}}
        return {"reasoning": reasoning, "content": None, "tool_calls": [call], "finish": "tool_calls"}
    if last.get("role") == "tool":
        content = f"The tool returned: {last.get('content')}"
    elif body.get("ignore_eos") and body.get("max_tokens"):
        # vLLM's benchmark switch: generate exactly max_tokens tokens.
        n = int(body["max_tokens"])
        return {"reasoning": None, "content": " ".join(f"tok{i}" for i in range(n)), "tool_calls": None,
                "finish": "length"}
    else:
        content = f"Hello from the modelfleet lab engine double ({eng.engine}, serving {eng.served})."
    budget = body.get("max_completion_tokens") or body.get("max_tokens")
    if budget is not None and reasoning and int(budget) <= words(reasoning):
        # The budget ran out inside the reasoning: no content, finish_reason "length".
        return {"reasoning": " ".join(reasoning.split()[: int(budget)]), "content": None, "tool_calls": None,
                "finish": "length"}
    if budget is not None and int(budget) < words(reasoning) + words(content):
        content = " ".join(content.split()[: int(budget) - words(reasoning)])
        return {"reasoning": reasoning, "content": content, "tool_calls": None, "finish": "length"}
    return {"reasoning": reasoning, "content": content, "tool_calls": None, "finish": "stop"}


def incomplete_history(messages: list[dict], reasoning: bool = True) -> str | None:
    """Why a tool result cannot be answered: the assistant turn before it lost its tool_calls or reasoning."""
    if not messages or messages[-1].get("role") != "tool":
        return None
    before = messages[-2] if len(messages) > 1 else {}
    calls = before.get("tool_calls") or []
    if before.get("role") != "assistant" or not calls:
        return "the assistant message with tool_calls must precede a tool message"
    if messages[-1].get("tool_call_id") not in {c.get("id") for c in calls}:
        return "tool_call_id does not match any tool call of the previous assistant message"
    if reasoning and not before.get("reasoning_content"):
        return "reasoning_content of the assistant tool-call turn was dropped (keep the whole message)"
    return None


def metrics_text(eng: Engine) -> str:
    c = COUNTERS
    label = f'model_name="{eng.served}"'
    names = {
        "vllm": [("vllm:num_requests_running", "gauge", c["running"]), ("vllm:num_requests_waiting", "gauge", 0),
                 ("vllm:kv_cache_usage_perc", "gauge", 0.01 * c["running"]),
                 ("vllm:prompt_tokens_total", "counter", c["prompt_tokens"]),
                 ("vllm:generation_tokens_total", "counter", c["generation_tokens"]),
                 ("vllm:prefix_cache_queries_total", "counter", c["prompt_tokens"]),
                 ("vllm:prefix_cache_hits_total", "counter", 0),
                 ("vllm:time_to_first_token_seconds_sum", "counter", c["ttft_sum"]),
                 ("vllm:time_to_first_token_seconds_count", "counter", c["ttft_count"])],
        "sglang": [("sglang:num_running_reqs", "gauge", c["running"]), ("sglang:num_queue_reqs", "gauge", 0),
                   ("sglang:token_usage", "gauge", 0.01 * c["running"]), ("sglang:cache_hit_rate", "gauge", 0.0),
                   ("sglang:prompt_tokens_total", "counter", c["prompt_tokens"]),
                   ("sglang:generation_tokens_total", "counter", c["generation_tokens"]),
                   ("sglang:time_to_first_token_seconds_sum", "counter", c["ttft_sum"]),
                   ("sglang:time_to_first_token_seconds_count", "counter", c["ttft_count"])],
        "llama.cpp": [("llamacpp:prompt_tokens_total", "counter", c["prompt_tokens"]),
                      ("llamacpp:tokens_predicted_total", "counter", c["generation_tokens"]),
                      ("llamacpp:requests_processing", "gauge", c["running"]),
                      ("llamacpp:requests_deferred", "gauge", 0)],
        "tokenspeed": [],  # smg's series are on its exporter's port, not the API's /metrics
        "ollama": [],  # Ollama serves no /metrics
    }[eng.engine]
    lines = []
    for name, kind, value in names:
        lines += [f"# TYPE {name} {kind}", f"{name}{{{label}}} {value}"]
    return "\n".join(lines) + "\n"


class Handler(BaseHTTPRequestHandler):
    eng: Engine
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        sys.stdout.write(f"INFO: {self.address_string()} - {fmt % args}\n")
        sys.stdout.flush()

    def _send(self, code: int, body, content_type="application/json"):
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        if not self.eng.api_key or KEY_FREE[self.eng.engine](self.path.split("?", 1)[0]):
            return True
        if self.headers.get("Authorization") == f"Bearer {self.eng.api_key}":
            return True
        self._send(401, {"error": "Unauthorized"})
        return False

    def do_HEAD(self):
        if self.eng.engine == "ollama":
            return self._ollama("HEAD")
        return self._send(404, {"error": "not found"})

    def do_GET(self):
        if self.eng.engine == "ollama" and self._ollama("GET") is not NotImplemented:
            return None
        if not self._authorized():
            return None
        if self.path == "/health":
            if self.eng.ready():
                return self._send(200, {"status": "ok"} if self.eng.engine == "llama.cpp" else "")
            return self._send(503, {"error": {"code": 503, "message": "Loading model"}})
        if self.path == "/metrics":
            return self._send(200, metrics_text(self.eng), "text/plain; version=0.0.4")
        if self.path == "/v1/models":
            if not self.eng.ready():
                return self._send(503, {"error": "model is loading"})
            model = {"id": self.eng.served, "object": "model", "created": int(STARTED), "owned_by": self.eng.engine}
            if self.eng.engine != "llama.cpp":
                return self._send(200, {"object": "list", "data": [model]})
            # llama-server also lists the model Ollama-style, and describes it (its GGUF's metadata)
            meta = {"vocab_type": 2, "n_vocab": 261, "n_ctx": 4096, "n_ctx_train": 4096, "n_embd": 64,
                    "n_params": 115648, "size": 462592, "ftype": "all F32"}
            ollama = {"name": self.eng.served, "model": self.eng.served, "modified_at": "", "size": "",
                      "digest": "", "type": "model", "description": "", "tags": [""], "capabilities": ["completion"],
                      "parameters": "", "details": {"parent_model": "", "format": "gguf", "family": "",
                                                    "families": [""], "parameter_size": "", "quantization_level": ""}}
            return self._send(200, {"models": [ollama], "object": "list", "data": [
                {**model, "aliases": [self.eng.served], "tags": [],
                 "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]}, "meta": meta}]})
        return self._send(404, {"error": "not found"})

    def do_POST(self):
        if self.eng.engine == "ollama" and self._ollama("POST") is not NotImplemented:
            return None
        if not self._authorized():
            return None
        native = self.path == NATIVE_ROUTES[self.eng.engine]
        if self.path != "/v1/chat/completions" and not native:
            return self._send(404, {"error": "not found"})
        if self.eng.engine == "ollama" and not self.eng.never_ready:
            time.sleep(max(0.0, STARTED + self.eng.load_delay - time.time()))  # Ollama loads on the first request
        if not self.eng.ready():
            return self._send(503, {"error": "model is loading"})
        kind = "invalid_request_error" if self.eng.engine == "llama.cpp" else "BadRequestError"
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        except ValueError as error:
            return self._send(400, {"error": {"code": 400, "message": f"parse error: {error}", "type": kind}})
        if native and not (isinstance(body, dict) and "messages" in body and self.eng.engine == "vllm"):
            return self._native(body if isinstance(body, dict) else {})
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return self._send(400, {"error": {"code": 400, "message": "Expected 'messages' to be an array",
                                              "type": kind}})
        broken = incomplete_history(body["messages"], reasoning=self.eng.engine != "llama.cpp")
        if broken:
            return self._send(400, {"error": {"message": broken, "type": "BadRequestError", "code": 400}})
        if body.get("model") not in (self.eng.served, None) and \
                not (self.eng.engine == "ollama" and f"{body.get('model')}:latest" == self.eng.served):
            return self._send(404, {"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                              "type": "NotFoundError", "code": 404}})
        with LOCK:
            COUNTERS["requests"] += 1
            COUNTERS["running"] += 1
            count = COUNTERS["requests"]
        try:
            self._complete(body)
        finally:
            with LOCK:
                COUNTERS["running"] -= 1
        if self.eng.crash_after and count >= self.eng.crash_after:
            sys.stdout.write(f"ERROR: engine double crashing after {count} requests (fault switch)\n")
            sys.stdout.flush()
            os._exit(1)
        return None

    def _native(self, body: dict):
        """A plain-text completion in the engine's own shape (vLLM's /invocations takes a completion request)."""
        prompt = body.get("prompt") or body.get("text") or ""
        if not isinstance(prompt, str) or not prompt:
            return self._send(400, {"error": {"code": 400, "message": "a prompt (text) is required",
                                              "type": "BadRequestError"}})
        sampling = (body.get("sampling_params") or {}).get("max_new_tokens")
        budget = {"vllm": body.get("max_tokens"), "llama.cpp": body.get("n_predict"),
                  "sglang": sampling, "tokenspeed": sampling}[self.eng.engine]
        text = f"Hello from the modelfleet lab engine double ({self.eng.engine}, serving {self.eng.served})."
        out = text.split()[: int(budget)] if budget is not None and int(budget) >= 0 else text.split()
        cut = len(out) < len(text.split())
        with LOCK:
            COUNTERS["requests"] += 1
            COUNTERS["prompt_tokens"] += words(prompt)
            COUNTERS["generation_tokens"] += len(out)
        if self.eng.engine == "vllm":
            return self._send(200, {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                                    "created": int(time.time()), "model": self.eng.served,
                                    "choices": [{"index": 0, "text": " ".join(out), "logprobs": None,
                                                 "finish_reason": "length" if cut else "stop"}],
                                    "usage": {"prompt_tokens": words(prompt), "completion_tokens": len(out),
                                              "total_tokens": words(prompt) + len(out)}})
        if self.eng.engine in ("sglang", "tokenspeed"):
            return self._send(200, {"text": " ".join(out), "meta_info": {
                "id": uuid.uuid4().hex, "prompt_tokens": words(prompt), "completion_tokens": len(out),
                "finish_reason": {"type": "length", "length": len(out)} if cut else {"type": "stop"}}})
        return self._send(200, {"content": " ".join(out), "model": self.eng.served, "stop": True,
                                "stop_type": "limit" if cut else "eos", "tokens_predicted": len(out),
                                "tokens_evaluated": words(prompt)})

    def _complete(self, body: dict):
        start = time.time()
        turn = answer(self.eng, body)
        prompt = sum(words(m.get("content")) for m in body.get("messages", []))
        out_words = (turn["reasoning"] or "").split() + (turn["content"] or "").split()
        usage = {"prompt_tokens": prompt, "completion_tokens": len(out_words),
                 "total_tokens": prompt + len(out_words)}
        with LOCK:
            COUNTERS["prompt_tokens"] += prompt
            COUNTERS["generation_tokens"] += len(out_words)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(start)
        if self.eng.slow_first_token:
            time.sleep(self.eng.slow_first_token)
        if not body.get("stream"):
            self._ttft(start)
            message = {"role": "assistant", "content": turn["content"]}
            if turn["reasoning"]:
                message["reasoning_content"] = turn["reasoning"]
            if turn["tool_calls"]:
                message["tool_calls"] = turn["tool_calls"]
            reply = {"id": rid, "object": "chat.completion", "created": created, "model": self.eng.served,
                     "usage": usage, "choices": [{"index": 0, "message": message, "finish_reason": turn["finish"]}]}
            if self.eng.engine == "llama.cpp":  # llama-server's additions: its build, cache use and timings
                elapsed_ms = (time.time() - start) * 1000
                reply.update(system_fingerprint="modelfleet-engine-double", timings={
                    "cache_n": 0, "prompt_n": prompt, "prompt_ms": 0.1, "prompt_per_token_ms": 0.1,
                    "prompt_per_second": 10000.0, "predicted_n": len(out_words), "predicted_ms": elapsed_ms,
                    "predicted_per_token_ms": elapsed_ms / max(1, len(out_words)),
                    "predicted_per_second": len(out_words) / max(elapsed_ms / 1000, 1e-6)})
                usage["prompt_tokens_details"] = {"cached_tokens": 0}
            if self.eng.version:
                reply["system_fingerprint"] = self.eng.version
            return self._send(200, reply)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()

        def chunk(delta, finish=None, usage_=None):
            data = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": self.eng.served,
                    "choices": [] if usage_ else [{"index": 0, "delta": delta, "finish_reason": finish}]}
            if self.eng.version:
                data["system_fingerprint"] = self.eng.version
            if usage_:
                data["usage"] = usage_
            self.wfile.write(f"data: {json.dumps(data)}\n\n".encode())
            self.wfile.flush()

        # llama-server's first chunk carries the role alone (content null); vLLM/SGLang send an empty string
        chunk({"role": "assistant", "content": None if self.eng.engine == "llama.cpp" else ""})
        self._ttft(start)
        for word in (turn["reasoning"] or "").split():
            time.sleep(self.eng.token_interval)
            chunk({"reasoning_content": word + " "})
        for word in (turn["content"] or "").split():
            time.sleep(self.eng.token_interval)
            chunk({"content": word + " "})
        for i, call in enumerate(turn["tool_calls"] or []):
            chunk({"tool_calls": [{"index": i, **call}]})
        chunk({}, finish=turn["finish"])
        if (body.get("stream_options") or {}).get("include_usage"):
            chunk({}, usage_=usage)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def _ollama(self, method: str):
        """Ollama's own routes (server/routes.go): GET / and /api/version answer once the server is up, a model is
        served only once registered (HEAD/POST /api/blobs/:digest, POST /api/create with the blob's digest), and
        /v1/models lists registered models by full name (name:latest). NotImplemented: the OpenAI chat route,
        served as for every engine."""
        path = self.path.split("?", 1)[0]
        store = OLLAMA_STORE
        if method == "HEAD":  # no body: the client does not read one
            exists = path.startswith("/api/blobs/") and (store / "blobs" / path[11:].replace(":", "-")).exists()
            return self._send(200 if path in ("/", "/api/version") or exists else 404, "")
        if method == "GET" and path == "/":
            return self._send(200, "Ollama is running", "text/plain; charset=utf-8")
        if method == "GET" and path == "/api/version":
            return self._send(200, {"version": OLLAMA_VERSION})
        if path.startswith("/api/blobs/"):
            digest = path.removeprefix("/api/blobs/")
            if not re.fullmatch(r"sha256[:-][0-9a-f]{64}", digest):
                return self._send(400, {"error": f"invalid digest format: {digest}"})
            blob = store / "blobs" / digest.replace(":", "-")
            data = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            got = "sha256:" + hashlib.sha256(data).hexdigest()
            if got != digest.replace("-", ":", 1):
                return self._send(400, {"error": f"digest mismatch, expected {digest!r}, got {got!r}"})
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(data)
            return self._send(201, "")
        if method == "POST" and path == "/api/create":
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            files = body.get("files") or {}
            missing = [d for d in files.values() if not (store / "blobs" / d.replace(":", "-")).exists()]
            if not body.get("model") or not files or missing:
                return self._send(400, {"error": f"missing blob or model: {missing or body.get('model')}"})
            self.eng.served = body["model"] if ":" in body["model"] else f"{body['model']}:latest"
            self.eng.parameters = body.get("parameters") or {}
            lines = [{"status": "parsing GGUF"}, *({"status": f"using existing layer {d}"} for d in files.values()),
                     {"status": "writing manifest"}, {"status": "success"}]
            return self._send(200, "".join(json.dumps(line) + "\n" for line in lines), "application/x-ndjson")
        if method == "GET" and path in ("/api/tags", "/v1/models"):
            models = [self.eng.served] if self.eng.served else []
            if path == "/api/tags":
                return self._send(200, {"models": [{"name": m, "model": m} for m in models]})
            return self._send(200, {"object": "list", "data": [
                {"id": m, "object": "model", "created": int(STARTED), "owned_by": "library"} for m in models]})
        if method == "POST" and path == "/api/generate":
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            if body.get("model") not in (self.eng.served, (self.eng.served or "").removesuffix(":latest")):
                return self._send(404, {"error": f"model '{body.get('model')}' not found"})
            return self._send(200, {"model": body["model"], "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ"),
                                    "response": "", "done": True, "done_reason": "load"})
        if method == "POST" and path == "/v1/chat/completions" and self.eng.served:
            return NotImplemented
        return self._send(404, "404 page not found", "text/plain")

    def _ttft(self, start: float):
        with LOCK:
            COUNTERS["ttft_sum"] += time.time() - start
            COUNTERS["ttft_count"] += 1


def _vllm_log(where: str, message: str) -> None:
    print(f"INFO {time.strftime('%m-%d %H:%M:%S')} [{where}] {message}", flush=True)


def compile_cache(engine: str, args: dict) -> None:
    """vLLM's torch.compile cache, as the real engine keeps it: a directory per hash of what the compiled graph
    depends on (where the server listens is not part of it), under VLLM_CACHE_ROOT, with Triton's kernels under
    TRITON_CACHE_DIR."""
    root = os.environ.get("VLLM_CACHE_ROOT")
    if engine != "vllm" or not root:
        return
    flags = {k: v for k, v in args.items() if k not in ("--host", "--port", "--api-key")}
    digest = hashlib.sha256(json.dumps(flags, sort_keys=True, default=str).encode()).hexdigest()[:10]
    graph = Path(root) / "torch_compile_cache" / digest / "rank_0_0" / "backbone"
    kernels = Path(os.environ.get("TRITON_CACHE_DIR") or Path(root) / "triton") / digest
    _vllm_log("backends.py:648", f"Using cache directory: {graph} for vLLM's torch.compile")
    artifacts = [graph / "vllm_compile_cache.py", graph / "computation_graph.py", kernels / "triton_poi_fused.cubin"]
    start = time.monotonic()
    if all(p.is_file() for p in artifacts):
        for path in artifacts:
            path.read_bytes()
        took = time.monotonic() - start
        _vllm_log("backends.py:164", f"Directly load the compiled graph(s) for dynamic shape from the cache, took "
                                     f"{took:.3f} s")
    else:
        time.sleep(float(os.environ.get("MODELFLEET_DOUBLE_COMPILE_S", "1")))
        for path in artifacts:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f".{path.name}.tmp")
            partial.write_bytes(hashlib.sha256(f"{digest}/{path.name}".encode()).digest() * 4096)
            partial.replace(path)  # whole or not at all, as Inductor and Triton write theirs
        took = time.monotonic() - start
        _vllm_log("backends.py:286", f"Compiling a graph for dynamic shape takes {took:.2f} s")
    _vllm_log("monitor.py:34", f"torch.compile takes {time.monotonic() - start:.2f} s in total")


# Ollama (engine "ollama", invoked as `ollama serve` or `ollama create NAME -f MODELFILE`): its environment says
# where it listens and keeps its store; its answers are held to Ollama's documented API and recorded answers
# (tests/fixtures/ollama/, tests/unit/test_ollama_double.py).
OLLAMA_VERSION = os.environ.get("MODELFLEET_DOUBLE_VERSION") or "0.32.15"
OLLAMA_STORE = Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models")


def ollama_address() -> tuple[str, int]:
    host, _, port = (os.environ.get("OLLAMA_HOST") or "127.0.0.1:11434").removeprefix("http://").rpartition(":")
    return host or "127.0.0.1", int(port or 11434)


def ollama_create(argv: list[str]) -> int:
    """`ollama create NAME -f MODELFILE`, as the CLI does it (cmd/cmd.go CreateHandler): the Modelfile's FROM
    file pushed as a blob (unless the server has it), then /api/create with its digest and the PARAMETERs."""
    import urllib.error
    import urllib.request

    if len(argv) != 3 or argv[1] != "-f":
        print("Error: usage: ollama create MODEL -f MODELFILE", file=sys.stderr)
        return 1
    name, lines = argv[0], Path(argv[2]).read_text().splitlines()
    source = next((line.split(None, 1)[1] for line in lines if line.upper().startswith("FROM ")), None)
    if source is None or not Path(source).is_file():
        print(f"Error: no Modelfile FROM file: {source}", file=sys.stderr)
        return 1
    parameters = {p.split()[1]: p.split()[2] for p in lines if p.upper().startswith("PARAMETER ")}
    data = Path(source).read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    host, port = ollama_address()
    base = f"http://{host}:{port}"
    try:
        urllib.request.urlopen(urllib.request.Request(f"{base}/api/blobs/{digest}", method="HEAD"), timeout=10)
    except urllib.error.HTTPError:
        urllib.request.urlopen(urllib.request.Request(f"{base}/api/blobs/{digest}", data=data), timeout=60)
    body = json.dumps({"model": name, "files": {Path(source).name: digest}, "parameters": parameters}).encode()
    with urllib.request.urlopen(urllib.request.Request(f"{base}/api/create", data=body), timeout=60) as answer:
        for line in answer.read().decode().splitlines():
            print(json.loads(line)["status"])
    return 0


def main() -> None:
    engine = engine_name()
    if engine == "ollama":
        if sys.argv[1:2] == ["create"]:
            sys.exit(ollama_create(sys.argv[2:]))
        if sys.argv[1:] not in (["serve"], ["start"]):
            sys.exit(f"Error: unknown command {sys.argv[1:]!r} for \"ollama\" (the double plays serve and create)")
        eng = Engine(engine, {"positional": [], "--host": ollama_address()[0], "--port": ollama_address()[1]})
        eng.served, eng.parameters = None, {}
        Handler.eng = eng
        ThreadingHTTPServer.request_queue_size = 128
        server = ThreadingHTTPServer((eng.host, eng.port), Handler)
        print(f"INFO: ollama double (Ollama {OLLAMA_VERSION}) listening on {eng.host}:{eng.port}", flush=True)
        server.serve_forever()
    if engine not in FLAGS:
        sys.exit(f"engine double: unknown engine {engine!r} (invoke as vllm, sglang or llama-server)")
    args = parse_args(engine, sys.argv[1:])
    if args.get("--headless"):
        # A vLLM headless worker serves no HTTP: it joins the head's data-parallel / torch.distributed group.
        print(f"INFO: {engine} double: headless worker (node rank {args.get('--node-rank', '-')}, DP start rank "
              f"{args.get('--data-parallel-start-rank', '-')}) "
              f"joined {args.get('--data-parallel-address') or args.get('--master-addr')}",
              flush=True)
        while True:
            time.sleep(3600)
    compile_cache(engine, args)
    eng = Engine(engine, args)
    Handler.eng = eng
    # A listen backlog of 5 (the stdlib default) drops SYNs at bench concurrency: 1 s retransmits, not the engine.
    ThreadingHTTPServer.request_queue_size = 128
    server = ThreadingHTTPServer((eng.host, eng.port), Handler)
    if engine == "sglang":  # SGLang prints its server arguments at start, its API key among them
        print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] server_args=ServerArgs(model_path={eng.served!r}, "
              f"host={eng.host!r}, port={eng.port}, api_key={eng.api_key!r})", flush=True)
    print(f"INFO: {engine} double serving {eng.served} on http://{eng.host}:{eng.port} "
          f"(ready after {eng.load_delay:.0f} s)", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
