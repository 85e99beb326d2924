"""`modelfleet drain` / `undrain`: a host's replicas leave their front doors before its engines stop (stopped
and disabled, nothing removed), and come back after they start again; a drain that leaves a model with no
endpoint needs --allow-outage; a front door that refuses stops the drain before any engine stops; a member of a
multi-node pool takes its pool along; a host not reached makes the command fail."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from modelfleet.cli import main
from modelfleet.cli.common import open_checked
from modelfleet.fleet import status as fleet_status
from modelfleet.plan import router
from tests.helpers.cli_runner import PIN, inventory


def replica(fabric: str, port: int) -> dict:
    return {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "sglang", "recipe": "tiny-lab-sglang",
            "port": port, "router": "r1", "router_bind_address": "127.0.0.1", "api_key_env": "MF_DRAIN_KEY",
            "fabric_address": fabric, "pool": f"p{port}", "ssh_hostname": fabric}


@pytest.fixture
def hosts(tmp_path, monkeypatch):
    """r1 (the front door's host, a replica too) and a, both serving tiny-lab behind the front door; on_hosts
    recorded: the router's list and calls as steps, every other script as it would run."""
    monkeypatch.setenv("MF_DRAIN_KEY", "drain-test-key-0123")
    inv = inventory(tmp_path, {"r1": replica("127.0.0.1", 18011), "a": replica("127.0.0.2", 18012)})
    resolved = open_checked(inv)
    rp = resolved.routers["tiny-lab"]
    listed = {w.url for w in rp.workers}
    ids = {url: f"id-{n}" for n, url in enumerate(sorted(listed))}
    steps, faults = [], {}

    def on_hosts(plans, script_of):
        out = {}
        for plan in plans:
            if plan.name in faults:
                out[plan.name] = faults[plan.name]
                continue
            script = script_of(plan)
            if router.list_command(rp) in script:
                rows = [{"id": ids[u], "url": u, "is_healthy": True} for u in sorted(listed)]
                listing = json.dumps({'workers': rows})
                out[plan.name] = (0, f"{fleet_status.MARK} router {rp.name}\nworkers={listing}\n", "")
                continue
            called = False
            for w in rp.workers:
                if router.remove_script(rp, w.url, ids[w.url]) in script:
                    steps.append(("out", w.host))
                    listed.discard(w.url)
                    called = True
                if router.add_script(rp, w.url) in script:
                    steps.append(("in", w.host))
                    listed.add(w.url)
                    called = True
            if not called:
                steps.append((plan.name, script))
            out[plan.name] = faults.get("door", (0, "", "")) if called else (0, "", "")
        return out

    monkeypatch.setattr(fleet_status, "on_hosts", on_hosts)
    return inv, resolved, steps, faults


def test_drain_takes_the_replica_out_then_stops_its_engine_and_undrain_reverses_it(hosts):
    inv, resolved, steps, _ = hosts
    unit = resolved.hosts["a"].services[0].unit_name
    out = CliRunner().invoke(main, ["drain", inv, "a", "--json"])
    assert out.exit_code == 0, out.output
    assert steps == [("out", "a"), ("a", f"systemctl disable --now {unit} && {{ systemctl reset-failed {unit} "
                                         "2>/dev/null || true; }")]  # nothing removed, r1 untouched
    report = json.loads(out.stdout)
    assert report["ok"] and report["hosts"] == ["a"] and report["units"] == {"a": [unit]}
    steps.clear()
    back = CliRunner().invoke(main, ["undrain", inv, "a"])
    assert back.exit_code == 0, back.output
    assert steps == [("a", f"systemctl enable --now {unit}"), ("in", "a")]
    assert f"a: {unit} enabled and started" in back.stdout


def test_a_drain_that_leaves_a_model_with_no_endpoint_needs_allow_outage(hosts):
    inv, _, steps, _ = hosts
    out = CliRunner().invoke(main, ["drain", inv, "r1", "a"])
    assert out.exit_code == 2 and "leaves tiny-lab with no endpoint (served by r1, a only)" in out.output
    assert "--allow-outage" in out.output and steps == []
    allowed = CliRunner().invoke(main, ["drain", inv, "gpus", "--allow-outage"])  # a group, as --limit takes
    assert allowed.exit_code == 0 and [s[0] for s in steps] == ["out", "out", "r1", "a"], allowed.output


def test_a_front_door_that_refuses_stops_the_drain_before_any_engine_stops(hosts):
    inv, _, steps, faults = hosts
    faults["door"] = (1, "", "router said no")
    out = CliRunner().invoke(main, ["drain", inv, "a", "--json"])
    assert out.exit_code == 1
    assert not any(isinstance(s[1], str) and "systemctl" in s[1] for s in steps), steps
    report = json.loads(out.stdout)
    assert report["stopped"] == {} and "no engine was stopped" in report["stopped_because"]


def test_a_host_not_reached_fails_the_drain(hosts):
    inv, _, steps, faults = hosts
    faults["a"] = OSError("Connection refused")
    out = CliRunner().invoke(main, ["drain", inv, "a", "--json"])
    assert out.exit_code == 1 and "Connection refused" in json.loads(out.stdout)["stopped"]["a"]


def test_a_member_of_a_multi_node_pool_takes_its_pool_along(tmp_path, monkeypatch):
    trays = {"hardware": "gb300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": PIN, "pool": "k31"}
    inv = inventory(tmp_path, {"t1": {**trays, "ssh_hostname": "10.0.0.1"},
                               "t2": {**trays, "ssh_hostname": "10.0.0.2"}})
    ran = []
    monkeypatch.setattr(fleet_status, "on_hosts", lambda plans, script_of: {
        p.name: ran.append(p.name) or (0, "", "") for p in plans})
    refused = CliRunner().invoke(main, ["drain", inv, "t2"])
    assert refused.exit_code == 2 and "leaves kimi-k3.1-pro with no endpoint" in refused.output and ran == []
    out = CliRunner().invoke(main, ["drain", inv, "t2", "--allow-outage", "--json"])
    assert out.exit_code == 0 and json.loads(out.stdout)["hosts"] == ["t1", "t2"] and ran == ["t1", "t2"]
