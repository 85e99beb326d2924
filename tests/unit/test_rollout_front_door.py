"""A rolling upgrade of replicas behind a front door: each batch's replica leaves the router before its switch
and comes back after its gate; a router that cannot take it out stops the rollout before anything switches."""

import json

import pytest

from modelfleet.fleet import rollout
from modelfleet.fleet import status as fleet_status
from modelfleet.plan import router
from modelfleet.plan.inventory import resolve

KEY = "rollout-front-door-key-0123"


def replica(fabric: str, port: int) -> dict:
    return {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "sglang", "recipe": "tiny-lab-sglang",
            "port": port, "router": "r1", "router_bind_address": "127.0.0.1", "api_key_env": "MF_ROLL_KEY",
            "fabric_address": fabric, "pool": f"p{port}"}


def setup(monkeypatch, list_answers=True, remove_ok=True):
    monkeypatch.setenv("MF_ROLL_KEY", KEY)
    resolved = resolve([("r1", replica("127.0.0.1", 18011)), ("a", replica("127.0.0.2", 18012))])
    assert not resolved.errors, resolved.errors
    rp = resolved.routers["tiny-lab"]
    listed = {w.url for w in rp.workers}
    steps = []

    def on_hosts(plans, script_of):
        out = {}
        for plan in plans:
            script = script_of(plan)
            if router.list_command(rp) in script:
                rows = [{"id": f"id-{n}", "url": u, "is_healthy": True} for n, u in enumerate(sorted(listed))]
                body = json.dumps({"workers": rows}) if list_answers is True else (list_answers or "")
                out[plan.name] = (0, f"{fleet_status.MARK} router {rp.name}\nworkers={body}\n", "")
                continue
            for worker in rp.workers:
                if router.remove_script(rp, worker.url, f"id-{sorted(listed).index(worker.url)}"
                                        if worker.url in listed else "") in script:
                    steps.append(("out", worker.host))
                    listed.discard(worker.url)
                if router.add_script(rp, worker.url) in script:
                    steps.append(("in", worker.host))
                    listed.add(worker.url)
            out[plan.name] = (0 if remove_ok else 1, "", "" if remove_ok else "router said no")
        return out

    rows = [{"host": n, "reachable": True, "services": [{"health": "200", "endpoint": "x", "image": "i",
                                                          "revision": "r"}]} for n in ("r1", "a")]
    monkeypatch.setattr(fleet_status, "on_hosts", on_hosts)
    monkeypatch.setattr(fleet_status, "status", lambda plans: rows)
    monkeypatch.setattr(rollout, "_pyinfra",
                        lambda inv, deploy, hosts, *a: steps.append((deploy, *hosts)) or (True, ""))
    return resolved, steps


def test_each_replica_leaves_the_front_door_before_its_switch_and_returns_after_its_gate(monkeypatch):
    resolved, steps = setup(monkeypatch)
    report = rollout.rollout("inv.py", resolved, log=lambda line: None)
    assert report["upgraded"] == ["r1", "a"] and not report["stopped"], report
    assert steps == [("modelfleet.run.deploys.prefetch", "r1"), ("out", "r1"), ("modelfleet.run.deploys.serve", "r1"),
                     ("in", "r1"),
                     ("modelfleet.run.deploys.prefetch", "a"), ("out", "a"), ("modelfleet.run.deploys.serve", "a"),
                     ("in", "a")]


@pytest.mark.parametrize("answer", [False, "<html>502 Bad Gateway</html>"])
def test_a_front_door_that_does_not_answer_stops_the_rollout_before_any_switch(monkeypatch, answer):
    resolved, steps = setup(monkeypatch, list_answers=answer)
    report = rollout.rollout("inv.py", resolved, log=lambda line: None)
    assert report["upgraded"] == [] and "out of the front door failed" in report["stopped"]
    assert "does not answer its worker API" in report["stopped"]
    assert steps == [("modelfleet.run.deploys.prefetch", "r1")]


def test_a_local_router_host_runs_the_calls_on_this_machine(tmp_path):
    """A host named @local (pyinfra's local connector) is not reached over SSH: the script runs here."""
    resolved = resolve([("@local", {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "sglang",
                                    "recipe": "tiny-lab-sglang"})])
    plan = resolved.hosts["@local"]
    marker = tmp_path / "ran-here"
    out = fleet_status.on_hosts([plan], lambda p: f"touch {marker}; echo {p.name}; echo refused >&2; exit 3")
    assert out == {"@local": (3, "@local\n", "refused\n")} and marker.exists()
