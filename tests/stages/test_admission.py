"""Admission's judge (pure): NVLink state counts only where the board's GPUs talk over NVLink to a peer."""

import copy
from pathlib import Path

from modelfleet.health import parse_smi_xml
from modelfleet.inventory import resolve
from modelfleet.stages.admission import judge

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
