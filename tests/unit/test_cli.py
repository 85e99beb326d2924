"""The command line (cli.py) through click's runner, each command against an inventory written for the test:
validate's report and exit codes, render's files with the key masked, verify against the lab's engine double on
a loopback port, prometheus to a file, converge's shards, cost from a bench report, and the usage errors that
stop a command before it connects anywhere."""

from __future__ import annotations

import json
import socket

import pytest
import yaml
from click.testing import CliRunner

from modelfleet.cli import main
from tests.engine_on_loopback import engine_on_loopback

PIN = "0123456789abcdef0123456789abcdef01234567"
H200 = {"hardware": "h200", "gpu_count": 1, "model": "qwen3-8b", "engine": "vllm", "gpu_stack": False,
        "revision": PIN}


def inventory(tmp_path, hosts: dict[str, dict], group: str = "gpus") -> str:
    path = tmp_path / "inv.py"
    path.write_text(f"{group} = {[(name, data) for name, data in hosts.items()]!r}\n")
    return str(path)


def run(*argv: str):
    return CliRunner().invoke(main, [str(a) for a in argv])


def test_validate_says_ok_and_where_it_looked_for_group_data(tmp_path):
    inv = inventory(tmp_path, {"g1": H200, "g2": H200})
    out = run("validate", inv)
    assert out.exit_code == 0
    lines = out.output.splitlines()
    assert lines[0] == "ok: 2 host(s), 2 pool(s)"
    assert lines[-1].startswith("group_data read: none (looked in ") and str(tmp_path / "group_data") in lines[-1]
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "gpus.py").write_text("verify_full = True\n")
    assert run("validate", inv).output.splitlines()[-1] == f"group_data read: {tmp_path / 'group_data' / 'gpus.py'}"


def test_validate_reports_every_problem_at_once_and_exits_2(tmp_path):
    inv = inventory(tmp_path, {"g1": {**H200, "port": 0}, "g2": {**H200, "modle": "qwen3-8b"}})
    out = run("validate", "--json", inv)
    assert out.exit_code == 2
    report = json.loads(out.output)
    assert not report["ok"] and report["hosts"] == ["g1", "g2"]
    assert {(e["where"], e["field"]) for e in report["errors"]} == {("host g1", "port"), ("host g2", "modle")}


def test_data_that_is_not_key_equals_value_is_a_usage_error(tmp_path):
    out = run("validate", inventory(tmp_path, {"g1": H200}), "--data", "reboot")
    assert out.exit_code == 2 and "reboot" in out.output and "Traceback" not in out.output


def test_render_prints_the_unit_and_env_file_with_the_key_masked(tmp_path, monkeypatch):
    monkeypatch.setenv("SITE_QWEN_KEY", "sk-cli-test-key")
    inv = inventory(tmp_path, {"g1": {**H200, "api_key_env": "SITE_QWEN_KEY"}})
    out = run("render", "--json", inv, "g1")
    assert out.exit_code == 0, out.output
    files = {f["path"]: f for f in json.loads(out.output)["files"]}
    unit = next(p for p in files if p.startswith("/etc/systemd/system/"))
    assert files[unit]["mode"] == "0644" and "ExecStart=" in files[unit]["content"]
    assert all(f["mode"] == "0600" for p, f in files.items() if p != unit)
    assert "sk-cli-test-key" not in out.output
    text = run("render", inv, "g1").output
    assert "sk-cli-test-key" not in text and f"# ==> {unit}\n" in text


def test_render_of_a_host_the_inventory_lacks_names_the_hosts_it_has(tmp_path):
    out = run("render", inventory(tmp_path, {"g1": H200}), "g9")
    assert out.exit_code == 2 and "no host 'g9'" in out.output and "(hosts: g1)" in out.output


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


def test_prometheus_writes_the_same_configuration_to_a_file_and_notes_loopback_engines(tmp_path):
    inv = inventory(tmp_path, {"g1": H200})
    printed = run("prometheus", inv)
    written = tmp_path / "prometheus.yml"
    to_file = run("prometheus", inv, "-o", written)
    assert printed.exit_code == to_file.exit_code == 0
    assert yaml.safe_load(written.read_text()) == yaml.safe_load(printed.stdout)
    assert to_file.stdout == "" and "listen on their host's loopback" in to_file.stderr


def test_converge_dry_keeps_a_pool_in_one_shard(tmp_path):
    trays = {"hardware": "gb300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": PIN, "pool": "k31"}
    inv = inventory(tmp_path, {"t1": {**trays, "ssh_hostname": "10.0.0.1"}, "t2": {**trays, "ssh_hostname": "10.0.0.2"},
                               "g1": {**H200, "ssh_hostname": "10.0.0.3"}, "g2": {**H200, "ssh_hostname": "10.0.0.4"}})
    out = run("converge", "--dry", "--shards", "3", inv)
    assert out.exit_code == 0, out.output
    shards = [sorted(s["hosts"]) for s in json.loads(out.output)["shards"]]
    assert sorted(h for s in shards for h in s) == ["g1", "g2", "t1", "t2"]
    assert ["t1", "t2"] in shards  # the pool together
    # One slice per control node: the same split, slice K of it; a bad slice is a usage error before anything.
    slices = [json.loads(run("converge", "--dry", "--shard", f"{k}/3", inv).output)["shards"] for k in (1, 2, 3)]
    assert [s["hosts"] for part in slices for s in part] == [s["hosts"] for s in json.loads(out.output)["shards"]]
    assert [s["shard"] for part in slices for s in part] == [1, 2, 3]
    bad = run("converge", "--dry", "--shard", "4/3", inv)
    assert bad.exit_code == 2 and "expected K/N" in bad.output
    both = run("converge", "--dry", "--shard", "1/3", "--shards", "2", inv)
    assert both.exit_code == 2 and "leave out --shards" in both.output


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


def test_plan_names_what_is_missing_or_unknown():
    assert "give INVENTORY HOST, or --model, --hardware and --gpus" in run("plan", "--model", "qwen3-8b").output
    out = run("plan", "--model", "no-such-model", "--hardware", "h200", "--gpus", "1")
    assert out.exit_code == 2 and "unknown model 'no-such-model' (known: " in out.output


def test_lab_runs_only_from_a_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = run("lab", "status")
    assert out.exit_code == 1 and "runs from the root of a modelfleet checkout" in out.output
