"""The netcheck gate on a two-host lab pool: the check script runs inside the serving image (the engine double
carries PyTorch CPU) with Gloo over the hosts' loopback addresses, on both hosts at once."""

import json
import os
import time

import pytest

from lab import scenario, ssh
from modelfleet.base.commands import run_pyinfra

pytestmark = pytest.mark.lab


def gate(tmp_path, **fields):
    """deploys/netcheck.py on the lab's first two hosts as one pool (and the scenario's other `fields`)."""
    scenario.write(gate_hosts=2, **fields)
    run = run_pyinfra("inventories/lab.py", "deploys/netcheck.py", env={"MODELFLEET_REPORTS": str(tmp_path)},
                      timeout=600)
    report = json.loads((tmp_path / "netcheck" / "gate.json").read_text())
    return run, report


def test_two_host_pool_passes_with_busbw_per_size_per_host(lab_hosts, tmp_path):
    run, report = gate(tmp_path)
    assert run.returncode == 0, run.stdout[-3000:]
    assert report["ok"] and report["hosts"] == [lab_hosts[0]["name"], lab_hosts[1]["name"]]
    for result in report["per_host"].values():
        sizes = [c["bytes"] for c in result["curve"] if c["op"] == "all_reduce"]
        assert sizes[0] == 1 << 20 and sizes[-1] == 64 << 20 and len(sizes) == 7
        assert result["world_size"] == 2 and result["busbw_gbps_at_largest"] > report["threshold_gbps"]
        for c in result["curve"]:
            factor = 1.0 if c["op"] == "all_reduce" else 0.5  # 2(n-1)/n and (n-1)/n at n = 2
            assert c["busbw_gbs"] == pytest.approx(c["algbw_gbs"] * factor, abs=0.002)


def test_members_reach_the_head_over_their_interface_in_seconds_before_the_collectives(lab_hosts, tmp_path):
    from modelfleet.run.stages.netcheck import REACH_TIMEOUT_S

    run, report = gate(tmp_path)
    assert run.returncode == 0, run.stdout[-3000:]
    for spec in lab_hosts[:2]:
        result = report["per_host"][spec["name"]]
        assert 0 <= result["reach_s"] < REACH_TIMEOUT_S
        # The pool's fabric names the interface, and Gloo in the gate's container got exactly that one.
        ifname = result["fabric"].rsplit("(interface ", 1)[1].rstrip(")")
        assert result["container_env"]["GLOO_SOCKET_IFNAME"] == ifname == "lo"


def test_threshold_above_what_the_lab_reaches_fails_with_the_figures(lab_hosts, tmp_path):
    run, report = gate(tmp_path, gate_min_busbw=1000)
    assert run.returncode != 0 and not report["ok"]
    assert len(report["problems"]) == 2
    assert all("GB/s at 67108864 B < 1000.0 GB/s required" in p for p in report["problems"])
    assert "< 1000.0 GB/s required" in run.stdout + run.stderr


def test_copy_bandwidth_asked_where_the_container_sees_no_gpu_fails_the_pool_saying_so(lab_hosts, tmp_path):
    """The wiring of admission_h2d: the gate runs on the two hosts, the check script refuses to measure copies
    with no GPU in the container, and the pool fails with that reason (real figures: docs/measurements/hw-runs)."""
    run, report = gate(tmp_path, admission_h2d=True)
    assert run.returncode != 0 and not report["ok"]
    assert report["problems"] == [f"{spec['name']}: the host-to-device check needs a GPU in the container: none is "
                                  "visible" for spec in lab_hosts[:2]]


def test_a_host_on_a_wrong_interface_fails_the_pool_and_no_unit_starts(lab_hosts, tmp_path):
    scenario.write(gate_hosts=2, gate_bad_ifname=True)
    env = {**os.environ, "MODELFLEET_REPORTS": str(tmp_path)}
    start = time.monotonic()
    run = run_pyinfra("inventories/lab.py", "deploys/serve.py", env=env, timeout=600)
    assert run.returncode != 0
    assert time.monotonic() - start < 15 + 60
    # The pool's fabric names the member and its interface before any container runs (preflight reads every
    # member's interfaces), not Gloo's rendezvous timeout; the pool is refused as a whole.
    fabric = json.loads((tmp_path / "fabric" / "gate.json").read_text())
    assert not fabric["ok"]
    assert any(lab_hosts[1]["name"] in e and "mfl-noif0" in e for e in fabric["errors"]), fabric["errors"]
    for spec in lab_hosts[:2]:
        preflight = json.loads((tmp_path / "preflight" / f"{spec['name']}.json").read_text())
        assert not preflight["ok"] and any("mfl-noif0" in p for p in preflight["problems"]), preflight["problems"]
        # serve.py stopped before the service stage on every host of the pool
        assert ssh(spec, "test -e /etc/systemd/system/modelfleet-gate.service || echo none").stdout.strip() == "none"


def serve(tmp_path, gate_hosts: int):
    scenario.write(gate_hosts=gate_hosts)
    env = {**os.environ, "MODELFLEET_REPORTS": str(tmp_path)}
    return run_pyinfra("inventories/lab.py", "deploys/serve.py", env=env, timeout=900)


def unit_of(spec):
    return ssh(spec, "cat /etc/systemd/system/modelfleet-gate.service").stdout


def test_pool_launches_multi_node_after_the_gate_then_grows_to_three_hosts(lab_hosts, tmp_path):
    run = serve(tmp_path, 2)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert json.loads((tmp_path / "netcheck" / "gate.json").read_text())["ok"]
    head, worker = unit_of(lab_hosts[0]), unit_of(lab_hosts[1])
    assert "--data-parallel-size 2" in head and "--headless" not in head
    assert "--data-parallel-start-rank 1" in worker and "--headless" in worker
    assert f"--data-parallel-address {lab_hosts[0]['address']}" in worker
    for spec in lab_hosts[:2]:
        assert ssh(spec, "systemctl is-active modelfleet-gate.service").stdout.strip() == "active"
    assert json.loads((tmp_path / "verify" / f"{lab_hosts[0]['name']}_gate.json").read_text())["ok"]

    grown = serve(tmp_path, 3)  # the third host joins the pool in the inventory
    assert grown.returncode == 0, grown.stdout[-3000:] + grown.stderr[-2000:]
    report = json.loads((tmp_path / "netcheck" / "gate.json").read_text())
    assert report["ok"] and report["hosts"] == [s["name"] for s in lab_hosts]
    assert all(v["world_size"] == 3 for v in report["per_host"].values())
    assert "--data-parallel-size 3" in unit_of(lab_hosts[0])
    assert "--data-parallel-start-rank 2" in unit_of(lab_hosts[2])
    for spec in lab_hosts:
        assert ssh(spec, "systemctl is-active modelfleet-gate.service").stdout.strip() == "active"
