"""modelfleet.cli.observe through click's runner: verify against the lab's engine double on a loopback port, cost
from a bench report, and the usage errors of bench and tunnel before they send anything."""

from __future__ import annotations

import json
import socket

import pytest
import yaml

from tests.helpers.cli_runner import H200, inventory, run
from tests.helpers.engine_on_loopback import engine_on_loopback


@pytest.mark.parametrize("served, code", [("tiny-lab", 0), ("another-model", 1)])
def test_verify_checks_each_endpoint_and_exits_1_when_one_fails(tmp_path, monkeypatch, served, code):
    with engine_on_loopback(monkeypatch, "vllm", served=served) as url:
        port = int(url.rsplit(":", 1)[1])
        inv = inventory(tmp_path, {"@local": {**H200, "port": port, "served_name": "tiny-lab"}})
        out = run("verify", inv, "--ready-timeout", "0")
    [report] = json.loads(out.stdout)
    assert out.exit_code == code and report["ok"] is (code == 0)
    assert report["readiness"]["ok"] is (code == 0)
    if code == 0:
        assert report["smoke"]["ok"] and report["tool_probe"]["ok"]


def test_cost_prints_one_row_per_run(tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"endpoint": "g1/g1", "model": "tiny-lab", "levels": [
        {"concurrency": 1, "duration_s": 3600, "successful_tasks": 100, "attempts": 100, "failed_attempts": 0,
         "total_input_tokens": 1000, "total_output_tokens": 1000, "ttft": {"p99_ms": 10.0},
         "output_throughput": 1.0}]}))
    prices = tmp_path / "prices.yaml"
    prices.write_text(yaml.safe_dump({"compute": {"gpu_hour_usd": 2.0, "gpus": 1}}))
    out = run("cost", "--json", "--run", f"h200={bench}:{prices}")
    assert out.exit_code == 0, out.output
    [row] = json.loads(out.output)
    assert row["label"] == "h200" and row["cost_per_successful_task_usd"] == 0.02  # $2 for 100 tasks
    bad = run("cost", "--run", f"h200={bench}")
    assert bad.exit_code == 2 and "expected LABEL=BENCH.json:PRICES.yaml" in bad.output


@pytest.mark.parametrize("argv, says", [
    (["--model", "m"], "give an INVENTORY or --base-url"),
    (["--base-url", "http://127.0.0.1:9"], "--base-url needs --model"),
    (["--base-url", "http://127.0.0.1:9", "--model", "m", "--api-key-env", "MODELFLEET_TEST_UNSET_KEY"],
     "--api-key-env MODELFLEET_TEST_UNSET_KEY is not set"),
    (["--base-url", "http://127.0.0.1:9", "--model", "m", "--concurrency", "1,x"], "--concurrency must be integers"),
])
def test_bench_refuses_what_it_cannot_run_before_sending_anything(monkeypatch, argv, says):
    monkeypatch.delenv("MODELFLEET_TEST_UNSET_KEY", raising=False)
    out = run("bench", *argv)
    assert out.exit_code == 2 and says in out.output


def test_tunnel_refuses_a_local_port_already_in_use(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        inv = inventory(tmp_path, {"g1": {**H200, "ssh_hostname": "10.0.0.9"}})
        out = run("tunnel", inv, "g1", "--local-port", port)
        assert out.exit_code == 2 and f"local port {port} is already in use" in out.output
        other = run("tunnel", inv, "g1", "--pool", "nope")
        assert other.exit_code == 2 and "g1 serves no pool 'nope'" in other.output
