"""Fabric personas on the lab (lab/fabric.py): hosts whose /sys/class/infiniband, netdevs, routes, /dev/infiniband
and IMEX state are a synthetic 8x B300 with RoCE rails (and its worker with one fault each), a GB300 tray with
IMEX and an InfiniBand H100 host. The real fabric command on those hosts reads what tests/fixtures/fabric's dumps
say (one model writes both); a two-host pool of the B300 and its worker (the scenario's fabric) derives the rails
and the control interface; with each fault persona as the second member, serve.py is refused in preflight, before
any unit is written, within 60 s, with the member and its device named."""

import json
import os
import time
from pathlib import Path

import pytest

import lab
from modelfleet.base.commands import run_pyinfra
from modelfleet.base.host_commands import fabric_command
from modelfleet.host.facts.fabric import parse_fabric

pytestmark = pytest.mark.lab

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "fabric"
HEAD, WORKER = "b300x8-roce-0", "b300x8-roce-1"
RAILS = "=" + ",".join(f"mlx5_{i}:1" for i in range(10, 18))
# fault persona -> the one line the pool's fabric report refuses it with ({worker}, {head}: the lab hosts' names)
FAULTS = {
    "b300x8-roce-1-port-down": "host {worker}: NCCL_IB_HCA: 7 usable HCAs (mlx5_10, mlx5_11, mlx5_12, mlx5_14, "
                               "mlx5_15, mlx5_16, mlx5_17), {head} has 8 (not usable here: mlx5_13): mlx5_13:1: "
                               "port 1 is DOWN (physical state Disabled)",
    "b300x8-roce-1-no-rocev2": "host {worker}: NCCL_IB_HCA: mlx5_12 port 1 has no RoCE v2 GID (NCCL needs one on "
                               "every HCA of the rail)",
    "b300x8-roce-1-7hca": "host {worker}: NCCL_IB_HCA: 7 usable HCAs (mlx5_10, mlx5_11, mlx5_12, mlx5_13, mlx5_14, "
                          "mlx5_15, mlx5_16), {head} has 8 (not usable here: mlx5_17): no other HCA on this rail",
    "b300x8-roce-1-no-route": "host {worker}: NCCL_SOCKET_IFNAME: no interface reaches head 10.0.0.11: no route "
                              "covers it and there is no default route (routes on "
                              + ", ".join(f"gpu{i}rdma0" for i in range(8)) + ")",
}
PERSONAS = [HEAD, WORKER, *FAULTS, "gb300x4-imex-0", "h100x8-ib-0"]


@pytest.fixture(scope="module")
def fabric_hosts(lab_hosts):
    """The fabric personas join the session's lab, one host each."""
    personas = [s["persona"] for s in lab_hosts] + PERSONAS
    specs = lab.up(len(personas), personas=personas, disks=1)[len(lab_hosts):]
    yield {s["persona"]: s for s in specs}
    lab.remove([s["name"] for s in specs])


def comparable(fact: dict) -> dict:
    """The fact without what the lab cannot show as the persona: which source answered (the H100 dump is the
    /proc/net form; the lab host answers `ip -j`) and the kernel modules (the machine's /proc/modules); and
    /dev/infiniband in `ls` order."""
    return {**{k: v for k, v in fact.items() if k not in ("source", "modules")},
            "dev_infiniband": sorted(fact["dev_infiniband"])}


def test_the_fabric_command_on_each_persona_reads_its_fixture(fabric_hosts):
    for persona, spec in fabric_hosts.items():
        run = lab.ssh(spec, fabric_command())
        got = parse_fabric(run.stdout.splitlines())
        want = parse_fabric((FIXTURES / lab.fabric.PERSONAS[persona].fixture).read_text().splitlines())
        assert comparable(got) == comparable(want), persona
    gb300 = parse_fabric(lab.ssh(fabric_hosts["gb300x4-imex-0"], fabric_command()).stdout.splitlines())
    assert gb300["imex"] == {"channels": ["channel0"], "active": "active", "enabled": "enabled",
                             "nodes": ["10.1.0.21", "10.1.0.22"]}
    # The sysfs tree is the lab host's own: the machine's /sys has no such HCA.
    assert not Path("/sys/class/infiniband/mlx5_10").exists()


def pair(tmp_path, deploy: str, persona: str):
    lab.scenario.write(fabric=persona)
    env = {**os.environ, "MODELFLEET_REPORTS": str(tmp_path)}
    start = time.monotonic()
    run = run_pyinfra("inventories/lab.py", deploy, env=env, timeout=300)
    return run, time.monotonic() - start, json.loads((tmp_path / "fabric" / "gate.json").read_text())


def test_the_healthy_pair_derives_the_rails_and_the_control_interface(fabric_hosts, tmp_path):
    run, _, fabric = pair(tmp_path, "deploys/preflight.py", WORKER)
    assert fabric["ok"] and fabric["errors"] == [], run.stdout[-3000:]
    head, worker = fabric_hosts[HEAD]["name"], fabric_hosts[WORKER]["name"]
    assert list(fabric["hosts"]) == [head, worker]
    for name, address in ((head, "10.0.0.11"), (worker, "10.0.0.12")):
        host = fabric["hosts"][name]
        assert host["env"] == {"NCCL_SOCKET_IFNAME": "=bond0", "GLOO_SOCKET_IFNAME": "bond0",
                               "VLLM_HOST_IP": address, "SGLANG_HOST_IP": address, "NCCL_IB_HCA": RAILS,
                               "NCCL_IB_ADDR_FAMILY": "AF_INET", "NCCL_IB_ROCE_VERSION_NUM": "2"}
        assert host["devices"] == ["/dev/infiniband/rdma_cm", *(f"/dev/infiniband/uverbs{i}" for i in range(1, 9))]
        assert "route group routes 10.224.0.0/16" in host["reasons"]["NCCL_IB_HCA"]
        assert "mlx5_bond_0:1: another route group (frontend, Ethernet)" in host["reasons"]["NCCL_IB_HCA"]
    assert fabric["hosts"][worker]["reasons"]["ifname"] == "bond0 routes to head 10.0.0.11 (10.0.0.0/24 dev bond0)"
    assert fabric["hosts"][head]["reasons"]["ifname"] == ("bond0 holds the head's address 10.0.0.11 "
                                                          "(this host is the head)")


@pytest.mark.parametrize("persona", list(FAULTS))
def test_each_fault_persona_is_refused_before_any_engine_naming_host_and_device(fabric_hosts, tmp_path, persona):
    head, worker = fabric_hosts[HEAD], fabric_hosts[persona]
    run, elapsed, fabric = pair(tmp_path, "deploys/serve.py", persona)
    assert run.returncode != 0 and elapsed < 60, (elapsed, run.stdout[-3000:])
    line = FAULTS[persona].format(worker=worker["name"], head=head["name"])
    assert not fabric["ok"] and fabric["errors"] == [line]
    assert fabric["hosts"] == {}
    for spec in (head, worker):  # the pool is refused as a whole, in preflight
        preflight = json.loads((tmp_path / "preflight" / f"{spec['name']}.json").read_text())
        assert not preflight["ok"] and f"gate: fabric: {line}" in preflight["problems"], preflight["problems"]
        gate_unit = lab.ssh(spec, "test -e /etc/systemd/system/modelfleet-gate.service || echo none")
        assert gate_unit.stdout.strip() == "none"
    assert lab.engine_containers([head["name"], worker["name"]]) == []
    assert line in run.stdout + run.stderr
