"""The real llama-server in the lab (#18): the llama.cpp host runs Debian's llama-server on the lab's tiny GGUF.
The whole gate runs against it (readiness, /v1/models, chat, the tool-call probe through its grammar and its
parser, multi-turn, a streaming bench, /metrics), and the engine double in llama.cpp mode is held to it: the
same requests to both, the same shape back."""

import json
import re
import subprocess
import time
import urllib.error
import urllib.request

import pytest

import lab
from modelfleet import REPO_ROOT
from modelfleet.base.commands import modelfleet_argv, run_pyinfra
from modelfleet.run.checks import Endpoint
from modelfleet.run.checks.probe import WEATHER_TOOL, verify

pytestmark = pytest.mark.lab

# The llama.cpp metric names the operations guide's "What to watch" table tells operators to query.
WATCHED_METRICS = set(re.findall(r"llamacpp:[a-z_]+", (REPO_ROOT / "docs" / "operations.md").read_text()))
DOUBLE_ADDRESS = "127.0.1.98"


@pytest.fixture(scope="module")
def real(lab_hosts):
    spec = next(s for s in lab_hosts if s["engine"] == "llama.cpp")
    served = run_pyinfra("inventories/lab.py", "deploys/serve.py", extra=["--limit", spec["name"]], cwd=REPO_ROOT,
                         timeout=600)
    assert served.returncode == 0, (served.stdout + served.stderr)[-4000:]
    return spec, f"http://{spec['address']}:8080"


@pytest.fixture(scope="module")
def double(real, tmp_path_factory):
    """The engine double playing llama-server, with the real one's GGUF and flags, beside it."""
    spec, _ = real
    name = f"modelfleet-llamacpp-double-{lab.PREFIX}test"  # lab down removes it if this test dies midway
    gguf = lab.STATE / "tiny-lab.gguf"
    subprocess.run(["docker", "run", "-d", "--rm", "--network", "host", "--name", name, "-v", f"{gguf}:/m/tiny.gguf:ro",
                    "--entrypoint", "/app/llama-server", lab.DOUBLE_IMAGE, "--model", "/m/tiny.gguf", "--alias",
                    "tiny-lab", "--host", DOUBLE_ADDRESS, "--port", "8080", "--ctx-size", "4096", "--jinja",
                    "--metrics"], check=True, capture_output=True)
    base = f"http://{DOUBLE_ADDRESS}:8080"
    for _ in range(50):
        try:
            urllib.request.urlopen(f"{base}/health", timeout=1).read()
            break
        except OSError:
            time.sleep(0.2)
    yield base
    subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def test_the_endpoint_is_the_real_llama_server(real):
    _, base = real
    props = json.load(urllib.request.urlopen(f"{base}/props", timeout=5))
    assert props["build_info"].startswith("b11669") and props["model_alias"] == "tiny-lab"
    assert props["chat_template_caps"]["supports_tool_calls"]


def test_the_whole_gate_passes_against_it_with_the_tool_call_made_by_its_grammar(real):
    _, base = real
    report = verify(Endpoint(name="real-llama", base_url=base, model="tiny-lab", engine="llama.cpp",
                             tool_choice="required", final_tool_choice="none"), ready_timeout_s=30)
    assert report["ok"], json.dumps(report, indent=2)[:3000]
    probe = report["tool_probe"]
    assert probe["tool_calls"] == 1 and probe["finish_reason"] == "tool_calls" and set(probe["arguments"]) == {"city"}
    assert probe["final_finish_reason"] == "stop" and probe["final_answer"]
    assert report["smoke"]["finish_reason"] == "stop" and report["smoke"]["content"]


def test_asked_as_a_user_would_the_random_model_is_told_apart_from_a_broken_server(real):
    """tool_choice auto: a random model rarely calls; the probe says so instead of blaming the parser."""
    _, base = real
    from modelfleet.run.checks.probe import tool_probe

    results = [tool_probe(Endpoint(name="real-llama", base_url=base, model="tiny-lab", engine="llama.cpp"))
               for _ in range(3)]
    for result in results:
        if not result["ok"] and result["tool_calls"] == 0:
            assert result["model_limited"] and result["parser_failures"] == 0, result


def test_a_streaming_bench_measures_real_ttft_and_tpot(real, tmp_path):
    spec, _ = real
    argv = modelfleet_argv("bench", "inventories/lab.py", "--host", spec["name"], "--concurrency", "1,4",
                           "--num-prompts", "8", "--input-len", "32", "--output-len", "16", "--out", str(tmp_path))
    run = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    [result] = json.loads(run.stdout)
    for level in result["levels"]:
        assert level["completed"] == 8 and level["failed_attempts"] == 0
        assert level["total_output_tokens"] == 8 * 16  # llama-server honours ignore_eos
        assert 0 < level["ttft"]["median_ms"] and level["tpot"]["mean_ms"] > 0


def test_metrics_carry_the_names_the_operations_guide_lists(real):
    _, base = real
    text = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
    names = {line.split("{")[0].split()[0] for line in text.splitlines() if line and not line.startswith("#")}
    assert len(WATCHED_METRICS) >= 2 and WATCHED_METRICS <= names


def _shape(value):
    """Field names and JSON types, recursively; lists by their first element."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__


def _exchange(base: str) -> dict:
    """The same requests, raw over HTTP: status codes, bodies' shapes, streaming chunks' shapes."""
    def call(path, body=None, method="GET"):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{base}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    out = {}
    status, text = call("/v1/models")
    out["models"] = (status, _shape(json.loads(text)))
    chat = {"model": "tiny-lab", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    status, text = call("/v1/chat/completions", chat, "POST")
    out["chat"] = (status, _shape(json.loads(text)))
    tools = {**chat, "tools": [WEATHER_TOOL], "tool_choice": "required", "max_tokens": 512}
    status, text = call("/v1/chat/completions", tools, "POST")
    out["tool_call"] = (status, _shape(json.loads(text)["choices"][0]["message"]["tool_calls"][0]))
    status, text = call("/v1/chat/completions", {**chat, "stream": True, "stream_options": {"include_usage": True}},
                        "POST")
    chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    out["stream"] = (status, _shape(chunks[0]["choices"][0]["delta"]), "data: [DONE]" in text,
                     bool(chunks[-1].get("usage")))
    status, text = call("/v1/chat/completions", {"messages": "not a list"}, "POST")
    out["bad_request"] = (status // 100, sorted(json.loads(text)))
    return out


def test_the_double_in_llama_cpp_mode_answers_in_the_real_servers_shape(real, double):
    _, base = real
    got, want = _exchange(double), _exchange(base)
    for key in want:
        assert got[key] == want[key], (key, got[key], want[key])
