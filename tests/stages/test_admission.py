"""Stage admission: its judge (pure: NVLink state counts only where the board's GPUs talk over NVLink to a peer),
and through pyinfra's @fake connector the health read riding in preflight's probe and a refused host failing its
whole pool."""

import copy
import json
from pathlib import Path

import pytest
from pyinfra.api.exceptions import PyinfraError

from modelfleet.host.health import parse_smi_xml
from modelfleet.plan.inventory import resolve
from modelfleet.run.pipeline import run_stages
from modelfleet.run.stages import admission, preflight
from modelfleet.run.stages.admission import judge
from tests.helpers.fake_hosts import admission_host

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
H200_XML = (FIXTURES / "gpu-hosts" / "h200x1-ubuntu2404" / "nvidia-smi-q-x.txt").read_text().split("__rc=")[0]


def plan(gpus: int):
    resolved = resolve([("h", {"hardware": "h200", "gpu_count": gpus, "model": "qwen3-8b", "engine": "vllm"})])
    assert not resolved.errors, resolved.errors
    return resolved.hosts["h"]


def health(gpus: int, nvlink: dict) -> dict:
    one = parse_smi_xml(H200_XML)[0]
    board = [{**copy.deepcopy(one), "index": i, "bus_id": f"00000000:{i:02X}:00.0"} for i in range(gpus)]
    for gpu in board:  # an HGX board whose Fabric Manager finished (the capture is one GPU in a VM: N/A)
        gpu["fabric"]["state"] = "Completed"
    return {"gpus": board, "xids": [], "driver": "580.159.04", "kernel": "6.8.0", "boot_id": "b", "nvlink": nvlink}


def test_an_inactive_link_on_an_eight_gpu_board_refuses_the_host():
    links = {i: {"links": 18, "inactive": [7] if i == 3 else []} for i in range(8)}
    report = judge(plan(8), health(8, links), {})
    assert not report["ok"] and report["reasons"] == ["GPU 3: NVLink link(s) 7 of 18 inactive"]
    healthy = {i: {"links": 18, "inactive": []} for i in range(8)}
    assert judge(plan(8), health(8, healthy), {})["ok"]


def test_one_gpu_alone_is_not_judged_on_nvlink():
    report = judge(plan(1), health(1, {0: {"links": 18, "inactive": list(range(18))}}), {})
    assert report["ok"], report["reasons"]


def test_admission_admits_the_recorded_h200_and_refuses_a_fallen_gpu(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    xml = (fake.H200 / "nvidia-smi-q-x.txt").read_text().split("__rc=")[0]
    state = fake.run_fake([("h200", admission_host(fake, xml))], lambda: run_stages(preflight, admission))
    report = json.loads((tmp_path / "admission" / "_fake_h200.json").read_text())
    assert report["ok"] and not state.failed_hosts and report["fingerprint"]["serials"] == ["1653824070535"]
    assert report["fingerprint"]["driver"] == "580.159.04"
    assert len(fake.executed(state, "h200")) == 1  # the probe carried the health read: one command in all
    assert report["valid_until"] - report["admitted_at"] == 24 * 3600
    fallen = ["NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."]
    with pytest.raises(PyinfraError, match="No hosts remaining"):  # the one host was refused
        fake.run_fake([("h200", admission_host(fake, xml, fallen))], lambda: run_stages(preflight, admission))
    report = json.loads((tmp_path / "admission" / "_fake_h200.json").read_text())
    assert not report["ok"] and "fallen off the bus" in report["reasons"][0] and report["valid_until"] is None


def test_a_refused_host_fails_its_whole_pool_like_the_gate(fake, tmp_path, monkeypatch):
    """Two hosts of one pool: the healthy one is admitted on its own checks, but its pool may not start."""
    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    xml = (fake.H200 / "nvidia-smi-q-x.txt").read_text().split("__rc=")[0]
    fallen = ["NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."]
    pool = {"model": "tiny-lab", "recipe": "tiny-lab-vllm-dp2", "pool": "pair"}
    hosts = [("good", {**admission_host(fake, xml), **pool, "ssh_hostname": "192.0.2.1"}),
             ("bad", {**admission_host(fake, xml, fallen), **pool, "ssh_hostname": "192.0.2.2"})]
    state = fake.run_fake(hosts, lambda: run_stages(preflight, admission), dry=True)
    with pytest.raises(PyinfraError, match="No hosts remaining"):  # both: the bad one and, for it, the good one
        fake.finish(state)
    good = json.loads((tmp_path / "admission" / "_fake_good.json").read_text())
    assert good["ok"]  # its own GPUs pass; the pool gate is what stops it
    assert state.inventory.get_host("@fake/good") in state.failed_hosts
