"""Day-two commands against the lab over real SSH (fabric): status, logs, tunnel; and the Prometheus config."""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from openai import OpenAI

from lab import ssh
from modelfleet.base.commands import modelfleet_argv, run_pyinfra

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def served(lab_hosts):
    run = run_pyinfra("inventories/lab.py", "deploys/serve.py", timeout=600)
    assert run.returncode == 0, run.stdout[-3000:]
    return lab_hosts


def test_status_reports_every_host_in_one_table_and_json(served):
    run = subprocess.run(modelfleet_argv("status", "inventories/lab.py", "--json"), capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(run.stdout)
    assert [r["host"] for r in rows] == [s["name"] for s in served]
    for row in rows:
        [svc] = row["services"]
        assert svc["state"] == "active/running" and svc["health"] == "200"
        assert "@sha256:" in svc["image"] and len(svc["revision"]) == 40 and svc["restarts"] == 0
    table = subprocess.run(modelfleet_argv("status", "inventories/lab.py"), capture_output=True,
                           text=True, timeout=120).stdout
    header = ["HOST", "ADMITTED", "POOL", "GPUS", "STATE"]
    assert table.splitlines()[0].split()[:5] == header and len(table.splitlines()) == 4


def test_status_names_an_unreachable_host(served):
    ssh(served[2], "systemctl stop ssh.socket ssh.service 2>/dev/null; systemctl stop ssh")
    try:
        run = subprocess.run(modelfleet_argv("status", "inventories/lab.py", "--json"),
                             capture_output=True, text=True, timeout=120)
        rows = {r["host"]: r for r in json.loads(run.stdout)}
        assert run.returncode == 1 and not rows[served[2]["name"]]["reachable"]
        assert rows[served[0]["name"]]["reachable"]
    finally:
        subprocess.run(["docker", "exec", served[2]["name"], "systemctl", "start", "ssh"], capture_output=True)
        time.sleep(1)


def test_logs_prefix_every_line_with_its_host(served):
    run = subprocess.run(modelfleet_argv("logs", "inventories/lab.py", served[0]["name"], served[1]["name"], "-n",
                          "5"), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stdout.splitlines() if line]
    prefixes = {line.split(" ", 1)[0] for line in lines}
    assert prefixes == {f"[{served[0]['name']}]", f"[{served[1]['name']}]"}
    assert any("double serving tiny-lab" in line or "INFO" in line for line in lines)


def test_tunnel_forwards_a_local_port_to_the_endpoint_and_refuses_a_busy_one(served):
    spec = served[0]
    proc = subprocess.Popen(modelfleet_argv("tunnel", "inventories/lab.py", spec["name"], "--local-port", "18777"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if not line:
            proc.wait(timeout=10)
            pytest.fail(f"tunnel printed nothing (exit {proc.returncode}): {proc.stderr.read()[-2000:]}")
        info = json.loads(line)
        assert info["base_url"] == "http://127.0.0.1:18777/v1"
        client = OpenAI(base_url=info["base_url"], api_key="none")
        assert [m.id for m in client.models.list().data] == ["tiny-lab"]
        reply = client.chat.completions.create(model="tiny-lab", messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].finish_reason == "stop" and "tiny-lab" in reply.choices[0].message.content
        busy = subprocess.run(modelfleet_argv("tunnel", "inventories/lab.py", spec["name"], "--local-port", "18777"),
                              capture_output=True, text=True, timeout=60)
        assert busy.returncode == 2 and "local port 18777 is already in use" in busy.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_prometheus_config_labels_every_engine(served, tmp_path):
    out = tmp_path / "prometheus.yml"
    run = subprocess.run(modelfleet_argv("prometheus", "inventories/lab.py", "--node-exporter", "-o", str(out)),
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    config = yaml.safe_load(out.read_text())
    engines = config["scrape_configs"][0]["static_configs"]
    assert {e["labels"]["host"] for e in engines} == {s["name"] for s in served}
    for entry in engines:  # the targets answer with the engines' metric names
        import urllib.request

        text = urllib.request.urlopen(f"http://{entry['targets'][0]}/metrics", timeout=5).read().decode()
        prefix = {"vllm": "vllm:", "sglang": "sglang:", "llama.cpp": "llamacpp:"}[entry["labels"]["engine"]]
        assert prefix in text
    assert config["scrape_configs"][1]["job_name"] == "modelfleet-node"


def test_converge_in_shards_runs_whole_pools_in_parallel_processes_with_one_summary(served, tmp_path, scenario):
    scenario(checkpoint_group=None)  # each pool its own group: shards hold whole pools
    env = {**os.environ, "MODELFLEET_REPORTS": str(tmp_path)}
    converge = modelfleet_argv("converge", "inventories/lab.py", "deploys/serve.py", "-y", "--shards", "2")
    dry = subprocess.run([*converge, "--dry"], env=env, capture_output=True, text=True, timeout=120)
    planned = json.loads(dry.stdout)["shards"]
    assert [len(s["hosts"]) for s in planned] == [2, 1] and not list(tmp_path.iterdir())  # --dry runs nothing
    run = subprocess.run(converge, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    summary = json.loads(run.stdout)
    assert summary["ok"] and [s["hosts"] for s in summary["shards"]] == [s["hosts"] for s in planned]
    assert sorted(h for s in summary["shards"] for h in s["hosts"]) == sorted(spec["name"] for spec in served)
    for shard in summary["shards"]:
        log = Path(shard["log"]).read_text()
        assert "Grand total" in log and all(f"[{name}]" in log for name in shard["hosts"])
        assert not any(f"[{spec['name']}]" in log for spec in served if spec["name"] not in shard["hosts"])
    assert "shard 2/2: 1 host(s), exit 0" in run.stderr
    failed = subprocess.run(modelfleet_argv("converge", "inventories/lab.py", "deploys/absent.py", "-y",
                                            "--shards", "2"),
                            env=env, capture_output=True, text=True, timeout=300)
    assert failed.returncode == 1 and json.loads(failed.stdout)["ok"] is False
