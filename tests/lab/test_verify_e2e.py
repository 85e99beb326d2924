"""The acceptance gate on the lab: verify inside serve.py, its failures, the bench (JSON + PNG) and regressions."""

import json
import os
import subprocess
import time

import pytest

import lab
from modelfleet.base.commands import modelfleet_argv, run_pyinfra
from modelfleet.run.checks import Endpoint
from modelfleet.run.checks.probe import verify

pytestmark = pytest.mark.lab


def serve(limit: str, engine_env: dict | None = None, reports=None, *data: str):
    lab.scenario.write(engine_env=engine_env or {})
    env = dict(os.environ)
    if reports:
        env["MODELFLEET_REPORTS"] = str(reports)
    extra = [arg for item in data for arg in ("--data", item)]
    return run_pyinfra("inventories/lab.py", "deploys/serve.py", extra=["--limit", limit, *extra], env=env, timeout=600)


def test_serve_runs_the_gate_and_catches_malformed_tool_calls(lab_hosts, tmp_path):
    host = lab_hosts[1]["name"]
    good = serve(host, None, tmp_path, "verify_full=true")
    assert good.returncode == 0, good.stdout[-3000:]
    report = json.loads((tmp_path / "verify" / f"{host}_tiny-{host}.json").read_text())
    assert report["ok"] and report["tool_probe"]["kept_reasoning_content"] and report["tool_probe"]["final_answer"]
    quiet = serve(host, reports=tmp_path)  # nothing changed: readiness only, and no change reported
    assert quiet.returncode == 0
    assert json.loads((tmp_path / "verify" / f"{host}_tiny-{host}.json").read_text())["scope"] == "readiness"

    bad = serve(host, {"MODELFLEET_DOUBLE_MALFORMED_TOOL_CALLS": "1"}, reports=tmp_path)
    out = bad.stdout + bad.stderr
    assert bad.returncode != 0
    assert "raw tool-call markup left in content" in out
    report = json.loads((tmp_path / "verify" / f"{host}_tiny-{host}.json").read_text())
    assert not report["ok"] and report["tool_probe"]["parser_failures"] >= 1
    assert serve(host, reports=tmp_path).returncode == 0  # back to the good engine


def _double(name: str, address: str, env: dict):
    image = f"{lab.REGISTRY}/{lab.ENGINE_IMAGES[0]}"
    argv = ["docker", "run", "-d", "--rm", "--network", "host", "--name", name]
    for key, value in env.items():
        argv += ["-e", f"{key}={value}"]
    subprocess.run([*argv, image, "serve", "tiny-lab", "--host", address, "--port", "8000"], check=True,
                   capture_output=True)


def test_never_ready_engine_fails_verify_within_its_timeout(lab_hosts):
    name = f"modelfleet-neverready-{lab.PREFIX}test"  # lab down removes it if this test dies midway
    _double(name, "127.0.1.99", {"MODELFLEET_DOUBLE_NEVER_READY": "1"})
    try:
        start = time.monotonic()
        report = verify(Endpoint(name="never-ready", base_url="http://127.0.1.99:8000", model="tiny-lab",
                                 engine="vllm"), ready_timeout_s=4)
        elapsed = time.monotonic() - start
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    assert not report["ok"] and "smoke" not in report
    assert "not ready after 4 s: /health answered 503" in report["readiness"]["error"]
    assert elapsed < 4 + 6


def test_reasoning_budget_is_reported_as_budget_not_failure(lab_hosts):
    from modelfleet.run.checks.probe import smoke

    spec = lab_hosts[0]
    ports = {"vllm": 8000, "sglang": 30000, "llama.cpp": 8080}
    ep = Endpoint(name="budget", base_url=f"http://{spec['address']}:{ports[spec['engine']]}", model="tiny-lab",
                  engine=spec["engine"], api_key=None)
    serve(spec["name"])
    result = smoke(ep, max_tokens=3)
    assert result["ok"] and result["finish_reason"] == "length" and "inside the reasoning" in result["warning"]


def test_bench_writes_json_and_png_and_compares_with_the_previous_run(lab_hosts, tmp_path):
    host = lab_hosts[2]["name"]
    serve(host)
    argv = modelfleet_argv("bench", "inventories/lab.py", "--host", host, "--concurrency", "1,4",
            "--num-prompts", "8", "--input-len", "32", "--output-len", "16", "--out", str(tmp_path))
    first = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    [result] = json.loads(first.stdout)
    for level in result["levels"]:
        assert level["completed"] == 8 and level["failed_attempts"] == 0
        assert level["total_output_tokens"] == 8 * 16  # ignore_eos: exactly output-len tokens each
        assert 0 < level["ttft"]["median_ms"] <= level["ttft"]["p99_ms"]
        assert level["tpot"]["mean_ms"] > 0 and level["itl"]["median_ms"] > 0 and level["output_throughput"] > 0
    assert result["levels"][0]["metrics"]["samples"] >= 1
    with open(result["plot"], "rb") as png:
        assert png.read(8) == b"\x89PNG\r\n\x1a\n"
    second = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    [again] = json.loads(second.stdout)
    assert second.returncode in (0, 1) and again["compared_with"] == result["started"]
    assert isinstance(again["regressions"], list)


def test_verify_bench_when_asked_and_a_slower_engine_fails_the_gate(lab_hosts, tmp_path):
    host = lab_hosts[0]["name"]  # the engine double: its tokens can be slowed down

    def run(engine_env=None):
        lab.scenario.write(engine_env=engine_env or {})
        env = {**os.environ, "MODELFLEET_REPORTS": str(tmp_path)}
        return run_pyinfra("inventories/lab.py", "deploys/serve.py",
                           extra=["--limit", host, "--data", "verify_bench=true"], env=env, timeout=600)

    first = run()
    assert first.returncode == 0, first.stdout[-3000:]
    report = json.loads((tmp_path / "verify" / f"{host}_tiny-{host}.json").read_text())
    assert report["bench"]["regressions"] == [] and os.path.exists(report["bench"]["plot"])
    slow = run({"MODELFLEET_DOUBLE_TOKEN_INTERVAL_S": "0.02"})  # ten times slower tokens
    assert slow.returncode != 0
    report = json.loads((tmp_path / "verify" / f"{host}_tiny-{host}.json").read_text())
    assert any("output" in flag and "tok/s" in flag for flag in report["bench"]["regressions"])
    assert "bench: concurrency" in slow.stdout + slow.stderr
    assert serve(host).returncode == 0  # the normal engine back for the tests after this one
