"""Rollout batches: a multi-node pool is one unit; single-node hosts go `parallel` at a time."""

from modelfleet.inventory import resolve
from modelfleet.rollout import batches

ONE = {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm"}
DP2 = {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm-dp2", "pool": "dp"}


def test_multi_node_pool_is_one_batch_and_singles_go_n_at_a_time():
    resolved = resolve([("a", {**ONE, "pool": "a"}), ("p1", DP2), ("b", {**ONE, "pool": "b"}), ("p2", DP2),
                        ("c", {**ONE, "pool": "c"})])
    assert not resolved.errors, resolved.errors
    assert batches(resolved, 1) == [["p1", "p2"], ["a"], ["b"], ["c"]]
    assert batches(resolved, 2) == [["p1", "p2"], ["a", "b"], ["c"]]
