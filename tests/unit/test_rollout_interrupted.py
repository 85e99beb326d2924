"""Ctrl-C during a rolling upgrade: the report names the batch and step it cut off, where each host stands, and
the command that finishes the rollout."""

from modelfleet import rollout
from modelfleet.inventory import resolve

ONE = {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm"}


def test_an_interrupted_switch_reports_batch_hosts_and_the_finishing_command(monkeypatch):
    resolved = resolve([(name, {**ONE, "pool": name}) for name in ("a", "b", "c")])
    assert not resolved.errors, resolved.errors
    rows = [{"host": name, "reachable": True, "services": [{"unit": f"modelfleet-{name}.service", "image": "img:1",
                                                            "revision": "r1", "health": "200", "endpoint": "x"}]}
            for name in ("a", "b", "c")]
    monkeypatch.setattr(rollout.fleet, "status", lambda plans: rows)
    calls = []

    def pyinfra(inventory, deploy, hosts, data, env):
        calls.append((deploy, hosts))
        if len(calls) == 4:  # batch 2's switch
            raise KeyboardInterrupt
        return True, ""

    monkeypatch.setattr(rollout, "_pyinfra", pyinfra)
    lines = []
    report = rollout.rollout("inventories/site.py", resolved, parallel=1, min_healthy=2, log=lines.append,
                             limit=("gpu*",))
    assert report["upgraded"] == ["a"]
    assert report["interrupted"]["batch"] == 2 and report["interrupted"]["hosts"] == ["b"]
    assert report["interrupted"]["step"] == "switch"
    assert report["interrupted"]["finish_with"] == \
        "modelfleet upgrade inventories/site.py --parallel 1 --min-healthy 2 --limit 'gpu*'"
    assert "batch 2 ['b'] during its switch" in report["stopped"]
    assert set(report["interrupted"]["hosts_now"]) == {"a", "b", "c"}
    assert "  b: img:1 health 200" in lines and lines[-1].startswith("finish with: modelfleet upgrade")
