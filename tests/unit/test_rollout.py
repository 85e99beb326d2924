"""Rollout batches: a multi-node pool is one unit; single-node hosts go `parallel` at a time."""

from modelfleet.fleet.rollout import batches
from modelfleet.plan.inventory import resolve

ONE = {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm"}
DP2 = {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm-dp2", "pool": "dp"}


def test_multi_node_pool_is_one_batch_and_singles_go_n_at_a_time():
    resolved = resolve([("a", {**ONE, "pool": "a"}), ("p1", DP2), ("b", {**ONE, "pool": "b"}), ("p2", DP2),
                        ("c", {**ONE, "pool": "c"})])
    assert not resolved.errors, resolved.errors
    assert batches(resolved, 1) == [["p1", "p2"], ["a"], ["b"], ["c"]]
    assert batches(resolved, 2) == [["p1", "p2"], ["a", "b"], ["c"]]


def test_a_batch_whose_restart_took_longer_than_its_recipes_budget_is_reported(monkeypatch, tmp_path):
    """The serve run of each batch writes its pools' timelines; upgrade holds each restart's ready_s to the
    recipe's ready_budget_s.restart (tiny-lab-llamacpp: 8 s) and reports the batch over it, without stopping."""
    import json
    import time

    from modelfleet.fleet import rollout

    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    llama = {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "llama.cpp", "recipe": "tiny-lab-llamacpp"}
    resolved = resolve([("a", {**llama, "pool": "pa"}), ("b", {**llama, "pool": "pb"}), ("c", {**llama, "pool": "pc"}),
                        ("d", {**ONE, "pool": "pd"})])
    assert not resolved.errors, resolved.errors
    assert resolved.hosts["a"].services[0].recipe.ready_budget_s.restart == 8
    rows = [{"host": h, "reachable": True, "services": [{"unit": f"u-{h}", "image": "i", "revision": "r",
                                                         "health": "200", "endpoint": h}]} for h in "abcd"]
    monkeypatch.setattr(rollout.fleet_status, "status", lambda plans: rows)
    ready = {"a": 11.5, "b": 3.2}  # what each host's restart took in its batch's serve run

    def pyinfra(inventory, deploy, hosts, data, env, inventory_args=()):
        if deploy.endswith("serve") and hosts[0] in ready:  # the timeline the real run writes at its end
            (tmp_path / "timeline").mkdir(exist_ok=True)
            (tmp_path / "timeline" / f"p{hosts[0]}.json").write_text(json.dumps(
                {"pool": f"p{hosts[0]}", "pyinfra_started_at": time.time(), "ready_s": ready[hosts[0]]}))
        return True, ""

    monkeypatch.setattr(rollout, "_pyinfra", pyinfra)
    (tmp_path / "timeline").mkdir()
    # A timeline left by an earlier run is not this batch's: it is not read as the restart's time.
    (tmp_path / "timeline" / "pc.json").write_text(json.dumps({"pyinfra_started_at": time.time() - 3600,
                                                               "ready_s": 999}))
    report = rollout.rollout("inventories/site.py", resolved, parallel=1, min_healthy=0, log=lambda line: None)
    assert report["upgraded"] == ["a", "b", "c", "d"] and report["stopped"] is None
    budgets = [b["ready_budget"] for b in report["batches"]]
    assert budgets[0] == [{"pool": "pa", "recipe": "tiny-lab-llamacpp", "budget_s": 8, "ready_s": 11.5,
                           "over": True}]
    assert budgets[1][0]["over"] is False
    assert budgets[2][0]["ready_s"] is None and budgets[2][0]["over"] is None  # c's run restarted nothing
    assert budgets[3] == []  # tiny-lab-vllm has no budget
    assert report["over_budget"] == ["batch 1 ['a']: pool pa ready 11.5 s after its run started, over its "
                                     "restart budget of 8 s (tiny-lab-llamacpp)"]


def test_a_ready_budget_whose_restart_exceeds_cold_is_refused():
    import pytest
    from pydantic import ValidationError

    from modelfleet.plan.catalog import ReadyBudget

    assert ReadyBudget(cold=60, restart=10, why="measured").restart == 10
    with pytest.raises(ValidationError, match="restart .20. may not exceed cold .10."):
        ReadyBudget(cold=10, restart=20, why="measured")
    with pytest.raises(ValidationError, match="less than or equal to 86400"):
        ReadyBudget(cold=7 * 86400, restart=1, why="measured")
