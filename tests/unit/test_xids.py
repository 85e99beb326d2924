"""NVIDIA's Xid catalog as data (modelfleet/plan/xids.py, catalog/xids.yaml) and admission by NVIDIA's action:
one Xid of each action class, as the kernel logs it (NVIDIA's documented line format, on the recorded H200's
bus), admitted or refused as written here, the action named; an Xid the catalog lacks is refused."""

import pytest

from modelfleet.host.health import parse_xids
from modelfleet.plan import xids
from tests.unit.test_health import judge

# action class -> (an Xid NVIDIA files under it, admitted?)
CLASSES = {
    "RESTART_APP": (13, True), "IGNORE": (63, True), "CHECK_UVM": (159, True), "WORKFLOW_XID_45": (45, True),
    "FOLLOW_OTHER_XID": (154, True),
    "RESET_GPU": (119, False), "RESTART_BM": (79, False), "RESTART_VM": (151, False),
    "WORKFLOW_XID_48": (48, False), "WORKFLOW_NVLINK_ERR": (74, False), "WORKFLOW_NVLINK5_ERR": (145, False),
    "CHECK_MECHANICALS": (54, False), "UPDATE_SWFW": (78, False), "UNEXPECTED_ERR_REPORT_ISSUE": (58, False),
}


def test_the_catalog_is_every_xid_nvidia_lists_with_a_known_action_and_its_source():
    data = xids.catalog()
    assert "docs.nvidia.com/deploy/xid-errors" in data["source"]
    assert sorted(data["xids"]) == list(range(1, 163))
    assert {e["action"] for e in data["xids"].values()} == set(xids.ACTIONS) == set(CLASSES)
    assert data["xids"][79]["mnemonic"] == "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"


@pytest.mark.parametrize("action", sorted(CLASSES))
def test_admission_follows_nvidia_s_action(action):
    xid, admitted = CLASSES[action]
    assert xids.catalog()["xids"][xid]["action"] == action
    events = parse_xids([f"[ 812.332] NVRM: Xid (PCI:0000:00:06): {xid}, pid=4242, name=python3, Channel 00000010"])
    result = judge(xids=events)
    assert result["ok"] is admitted
    if not admitted:
        [reason] = result["reasons"]
        assert reason.startswith(f"Xid {xid} on 0000:00:06 since boot") and f"NVIDIA's action {action}" in reason


def test_an_xid_the_catalog_lacks_is_refused():
    result = judge(xids=parse_xids(["NVRM: Xid (PCI:0000:00:06): 171, pid=1, name=x, something new"]))
    assert not result["ok"] and "not in NVIDIA's catalog" in result["reasons"][0]
