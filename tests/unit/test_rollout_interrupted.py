"""Ctrl-C during a rolling upgrade: the report names the batch and step it cut off, where each host stands, and
the command that finishes the rollout."""

import subprocess

from modelfleet.fleet import rollout
from modelfleet.plan.inventory import resolve

ONE = {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm"}


def test_an_interrupted_switch_reports_batch_hosts_and_the_finishing_command(monkeypatch):
    resolved = resolve([(name, {**ONE, "pool": name}) for name in ("a", "b", "c")])
    assert not resolved.errors, resolved.errors
    rows = [{"host": name, "reachable": True, "services": [{"unit": f"modelfleet-{name}.service", "image": "img:1",
                                                            "revision": "r1", "health": "200", "endpoint": "x"}]}
            for name in ("a", "b", "c")]
    monkeypatch.setattr(rollout.fleet_status, "status", lambda plans: rows)
    calls = []

    def pyinfra(inventory, deploy, hosts, data, env, inventory_args=()):
        calls.append((deploy, hosts))
        if len(calls) == 4:  # batch 2's switch
            raise KeyboardInterrupt
        return True, ""

    monkeypatch.setattr(rollout, "_pyinfra", pyinfra)
    lines = []
    report = rollout.rollout("inventories/site.py", resolved, parallel=1, min_healthy=2, log=lines.append,
                             limit=("gpu*",), allow_outage=True)
    assert report["upgraded"] == ["a"]
    assert report["interrupted"]["batch"] == 2 and report["interrupted"]["hosts"] == ["b"]
    assert report["interrupted"]["step"] == "switch"
    assert report["interrupted"]["finish_with"] == \
        "modelfleet upgrade inventories/site.py --parallel 1 --min-healthy 2 --allow-outage --limit 'gpu*'"
    assert "batch 2 ['b'] during its switch" in report["stopped"]
    assert set(report["interrupted"]["hosts_now"]) == {"a", "b", "c"}
    assert "  b: img:1 health 200" in lines and lines[-1].startswith("finish with: modelfleet upgrade")


def test_by_default_a_model_keeps_a_healthy_endpoint_outside_the_switching_batch(monkeypatch):
    resolved = resolve([(name, {**ONE, "pool": name}) for name in ("a", "b")])
    rows = [{"host": "a", "reachable": True, "services": [{"health": "200", "endpoint": "x"}]},
            {"host": "b", "reachable": True, "services": [{"health": "000", "endpoint": "x"}]}]
    monkeypatch.setattr(rollout.fleet_status, "status", lambda plans: rows)
    calls = []
    monkeypatch.setattr(rollout, "_pyinfra", lambda *args: calls.append(args) or (True, ""))
    report = rollout.rollout("inv.py", resolved, log=lambda line: None)
    assert calls == [] and report["upgraded"] == []  # b is down: switching a would leave tiny-lab unserved
    assert "would leave tiny-lab with no healthy endpoint" in report["stopped"]
    rows[1]["services"][0]["health"] = "200"
    report = rollout.rollout("inv.py", resolved, log=lambda line: None)
    assert report["upgraded"] == ["a", "b"] and not report["stopped"]
    alone = resolve([("a", {**ONE, "pool": "a"})])  # one host: nothing else can serve, the switch goes on
    rows.pop()
    assert rollout.rollout("inv.py", alone, log=lambda line: None)["upgraded"] == ["a"]


def test_every_pyinfra_run_of_the_rollout_gets_the_operators_data_and_a_rollback_wins_over_it(monkeypatch):
    resolved = resolve([("a", {**ONE, "pool": "a"})])
    rows = [{"host": "a", "reachable": True, "services": [{"image": "img:1", "revision": "r1", "health": "200",
                                                          "endpoint": "x"}]}]
    monkeypatch.setattr(rollout.fleet_status, "status", lambda plans: rows)
    argvs = []

    def run_pyinfra(inventory, deploy, **argv):
        from modelfleet.base.commands import pyinfra_argv

        argvs.append(pyinfra_argv(inventory, deploy, **{k: v for k, v in argv.items() if k not in ("env", "timeout")}))
        return subprocess.CompletedProcess([], 0 if len(argvs) < 2 else 1, "", "")  # the switch fails

    monkeypatch.setattr(rollout, "run_pyinfra", run_pyinfra)
    args = ["--group-data", "site/gd", "--data", "image=img:2"]
    report = rollout.rollout("inv.py", resolved, log=lambda line: None, inventory_args=args)
    assert [b["result"] for b in report["batches"]] == ["gate failed: rolled back"]
    assert all(argv[argv.index("--group-data"):][:4] == args for argv in argvs)
    rollback = argvs[-1]
    assert rollback.index("image=img:1") > rollback.index("image=img:2")  # pyinfra's last --data wins
