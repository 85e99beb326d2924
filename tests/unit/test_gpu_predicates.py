"""What the stack will do to a host's GPUs (gpu_predicates.py), decided from the recorded H200 host's probe read by
the real HostProbe: the loaded driver, whether the driver is replaced, whether Fabric Manager is needed, and the
NUMA note for a service whose GPUs span sockets."""

import pytest

from modelfleet.host.facts.probe import HostProbe
from modelfleet.plan.gpu_predicates import (
    branch_of,
    fabric_manager_needed,
    loaded_driver,
    locality_notes,
    replaces_driver,
)
from modelfleet.plan.inventory import resolve


@pytest.fixture
def h200(fake):
    """The recorded H200 host as preflight's one probe reads it (driver 580.159.04, one GPU of an HGX board)."""
    return HostProbe().process(fake.probe_reply({
        "nvidia_gpus": fake.recorded(fake.H200 / "nvidia-smi-query-gpu-header.txt"),
        "nvidia_versions": fake.recorded(fake.H200 / "nvidia-smi-version.txt"),
        "nvidia_module": fake.recorded(fake.H200 / "proc-driver-version.txt"),
        "topology": fake.recorded(fake.H200 / "nvidia-smi-topo.txt")}))


def plan(**data):
    return resolve([("h200", {"hardware": "h200", "gpu_count": 1, "model": "qwen3-8b", "engine": "vllm",
                              **data})]).hosts["h200"]


def test_the_loaded_driver_is_the_kernel_modules_else_nvidia_smis(h200):
    assert loaded_driver(h200) == "580.159.04"
    assert loaded_driver({"nvidia_versions": {"driver": "570.86.15"}}) == "570.86.15"
    assert loaded_driver({}) is None
    assert (branch_of("580.159.04"), branch_of(None), branch_of("unknown")) == (580, 0, 0)


def test_the_driver_is_replaced_only_off_the_branch_or_off_a_pinned_version(h200):
    assert not replaces_driver(plan(), h200)
    assert replaces_driver(plan(driver_version="580.95.05"), h200)
    assert not replaces_driver(plan(driver_version="580.159.04"), h200)
    assert replaces_driver(plan(), {})  # no driver loaded at all
    assert not replaces_driver(plan(gpu_stack=False), {})  # the site keeps its own stack


def test_fabric_manager_for_a_whole_board_not_for_one_gpu_of_it(h200):
    assert not fabric_manager_needed(plan(), h200)  # one GPU of an NVSwitch board sees no switch
    assert fabric_manager_needed(plan(gpu_count=8), h200)
    assert fabric_manager_needed(plan(), {**h200, "fabric_manager": {"nvswitches": 4}})


def test_a_service_across_numa_nodes_is_told_the_indices_that_keep_it_on_one():
    topology = {"numa": {f"GPU{i}": 0 if i < 4 else 1 for i in range(8)}}
    spanning = plan(gpu_count=8, gpu_indices=[2, 3, 4, 5])
    assert locality_notes(spanning, topology) == [
        "h200: GPUs 2,3,4,5 span NUMA nodes 0,1; gpu_indices [0, 1, 2, 3] would keep it on node 0"]
    assert locality_notes(plan(gpu_count=8, gpu_indices=[0, 1, 2, 3]), topology) == []
    assert locality_notes(spanning, {"numa": {f"GPU{i}": 0 for i in range(8)}}) == []
