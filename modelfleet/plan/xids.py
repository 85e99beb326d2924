"""NVIDIA's Xid catalog as data (modelfleet/plan/catalog/xids.yaml: every Xid of Ampere and newer GPUs with its
mnemonic and NVIDIA's immediate action, with its source), and what each action means for a host's admission:
an Xid whose action is the application's own (restart it, or nothing) leaves the host admissible; one that
asks for a GPU reset, a reboot, a mechanical or firmware check, NVIDIA's ECC or NVLink workflow, or support,
refuses it, naming the action. An Xid the catalog does not list is refused too: nothing vouches for it."""

from __future__ import annotations

from functools import lru_cache

import yaml

from modelfleet.plan.catalog import CATALOG_DIR

# NVIDIA's immediate action -> (does it keep the host out of a pool, what it asks, in words)
ACTIONS = {
    "RESTART_APP": (False, "restart the application"),
    "IGNORE": (False, "no action"),
    "CHECK_UVM": (False, "check the application's unified memory use"),
    "WORKFLOW_XID_45": (False, "the driver ended the application's channels: follow the Xid that preceded it"),
    "FOLLOW_OTHER_XID": (False, "follow the guidance of the Xid it names"),
    "RESET_GPU": (True, "reset the GPU (or reboot the node)"),
    "RESTART_BM": (True, "reboot the node"),
    "RESTART_VM": (True, "restart the virtual machine"),
    "WORKFLOW_XID_48": (True, "double-bit ECC error: reset the GPU, check row remapping; repeated: RMA"),
    "WORKFLOW_NVLINK_ERR": (True, "NVLink error: reset the GPU and check the links"),
    "WORKFLOW_NVLINK5_ERR": (True, "NVLink 5 error: NVIDIA's NVLink workflow (reset, then the fabric)"),
    "CHECK_MECHANICALS": (True, "check the board's power and cooling"),
    "UPDATE_SWFW": (True, "update the driver or firmware"),
    "UNEXPECTED_ERR_REPORT_ISSUE": (True, "not expected on this GPU: report it to NVIDIA support"),
}


@lru_cache(maxsize=1)
def catalog() -> dict:
    """{'source': ..., 'xids': {number: {'mnemonic', 'action'}}}"""
    return yaml.safe_load((CATALOG_DIR / "xids.yaml").read_text())


def judge(xid: int) -> tuple[bool, str]:
    """(keeps the host out, why in words) for one Xid seen since boot."""
    entry = catalog()["xids"].get(xid)
    if entry is None:
        return True, f"Xid {xid} is not in NVIDIA's catalog as modelfleet carries it: check the catalog"
    refuses, words = ACTIONS[entry["action"]]
    return refuses, f"{entry['mnemonic']}, NVIDIA's action {entry['action']}: {words}"
