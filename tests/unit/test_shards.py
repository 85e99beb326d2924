"""Shards for `modelfleet converge --shards N`: a pool or a checkpoint group is never split, shards are even
in hosts as the units allow, and none is empty."""

from modelfleet.fleet.shards import split, units
from modelfleet.plan.inventory import resolve

ONE = {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm"}
DP2 = {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm-dp2"}


def fleet():
    hosts = [("p1", {**DP2, "pool": "dp"}), ("p2", {**DP2, "pool": "dp"}),  # one pool of two hosts
             ("g1", {**ONE, "pool": "g1", "checkpoint_group": "rack"}),  # two pools sharing a checkpoint copy
             ("g2", {**ONE, "pool": "g2", "checkpoint_group": "rack"})]
    hosts += [(f"s{i}", {**ONE, "pool": f"s{i}"}) for i in range(6)]  # single hosts
    resolved = resolve(hosts)
    assert not resolved.errors, resolved.errors
    return resolved


def test_pools_and_checkpoint_groups_are_units():
    assert units(fleet()) == [["p1", "p2"], ["g1", "g2"], *[[f"s{i}"] for i in range(6)]]


def test_shards_keep_units_whole_and_even():
    shards = split(fleet(), 3)
    assert sorted(len(s) for s in shards) == [3, 3, 4]
    for unit in (["p1", "p2"], ["g1", "g2"]):
        assert any(set(unit) <= set(shard) for shard in shards)
    assert sorted(h for shard in shards for h in shard) == sorted(fleet().hosts)


def test_more_shards_than_units_leaves_none_empty():
    resolved = resolve([("p1", {**DP2, "pool": "dp"}), ("p2", {**DP2, "pool": "dp"})])
    assert split(resolved, 4) == [["p1", "p2"]]


def test_slices_k_of_n_are_the_shards_and_cover_the_fleet_once():
    """N control nodes running `converge --shard K/N` for K = 1..N converge every host once, pools whole."""
    from modelfleet.fleet.shards import slice_of

    slices = [slice_of(fleet(), f"{k}/3") for k in (1, 2, 3)]
    assert [hosts for _, _, hosts in slices] == split(fleet(), 3)
    assert sorted(h for _, _, hosts in slices for h in hosts) == sorted(fleet().hosts)
    assert all((k, n) == (i, 3) for i, (k, n, _) in enumerate(slices, 1))
    # More slices than units: the slices past the units are empty, not an error, so every K/N job can run.
    resolved = resolve([("p1", {**DP2, "pool": "dp"}), ("p2", {**DP2, "pool": "dp"})])
    assert [slice_of(resolved, f"{k}/2")[2] for k in (1, 2)] == [["p1", "p2"], []]
    for bad in ("0/3", "4/3", "3", "a/b", "1/300"):
        try:
            slice_of(fleet(), bad)
        except ValueError as error:
            assert "expected K/N" in str(error)
        else:
            raise AssertionError(bad)
