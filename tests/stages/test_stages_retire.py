"""The retire stage through pyinfra's @fake connector: a unit modelfleet wrote that the host's plan no longer
names is stopped, disabled and removed with its container and files, and named in the output and the host's
report; a unit the plan names is not touched; a replica dropped from a front door is taken out of the router's
list before its unit stops (the retire operation runs on every host at once, after every router stage)."""

import json
from dataclasses import replace

import pytest

from modelfleet.host.facts.state import OWNED_MARK
from modelfleet.host.units import UNIT_DIR
from modelfleet.plan import render, router
from modelfleet.plan.inventory import resolve
from modelfleet.run import pipeline
from modelfleet.run.stages import retire as retire_stage
from modelfleet.run.stages import router as router_stage
from tests.stages.test_stages_router import KEY, replica, state_lines, workers_json


@pytest.fixture(autouse=True)
def env(monkeypatch, tmp_path):
    monkeypatch.setenv("MF_STAGE_KEY", KEY)
    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    monkeypatch.setattr(router_stage, "endpoint_verified", lambda **kwargs: None)  # no endpoint on a @fake host
    return tmp_path


def owned_lines(units: dict[str, str]) -> list[str]:
    """What DeployedState prints for the unit directory holding these unit files (name -> text)."""
    lines = [f"@@modelfleet-state owned {UNIT_DIR}"]
    for unit, text in units.items():
        lines += [f"unit {unit}", "ActiveState=active", "UnitFileState=enabled"]
        lines += [f"= {line}" if line else "=" for line in text.splitlines()]
    return lines


def plans(hosts):
    result = resolve([(f"@fake/{n}", d) for n, d in hosts])
    assert result.errors == []
    return result


def test_a_unit_no_longer_named_is_stopped_disabled_and_removed_and_a_named_one_left(fake, env):
    hosts = [("a", {**replica("127.0.0.2", 18012), "router": None, "router_bind_address": None, "pool": "kept"})]
    kept = plans(hosts).hosts["@fake/a"].services[0]
    gone = replace(kept, pool="gone")
    texts = {kept.unit_name: render.render_unit(kept), gone.unit_name: render.render_unit(gone)}
    assert all(text.startswith(OWNED_MARK) for text in texts.values())
    hosts[0][1]["fake_responses"] = {"@@modelfleet-state": owned_lines(texts)}
    state = fake.run_fake(hosts, lambda: pipeline.run_stages(retire_stage))
    commands = fake.executed(state, "a")
    assert commands[1:] == [
        "systemctl disable --now -- modelfleet-gone.service",
        "if systemctl is-failed --quiet -- modelfleet-gone.service ; then systemctl reset-failed -- "
        "modelfleet-gone.service ; fi",
        f"if /usr/bin/docker container inspect {gone.container_name} >/dev/null 2>&1; then /usr/bin/docker rm -f "
        f"{gone.container_name} >/dev/null; fi",
        f"rm -f -- {UNIT_DIR}/modelfleet-gone.service {gone.env_file} {gone.secrets_config_file} {gone.auth_file}",
        "systemctl daemon-reload"], commands
    (path,) = (env / "retired").glob("*.json")
    report = json.loads(path.read_text())
    assert report["host"] == "@fake/a"
    assert [(r["unit"], r["container"], r["checkpoint_removed"]) for r in report["retired"]] == [
        ("modelfleet-gone.service", gone.container_name, False)]


def test_nothing_to_retire_sends_no_command(fake):
    hosts = [("a", {**replica("127.0.0.2", 18012), "router": None, "router_bind_address": None, "pool": "kept"})]
    kept = plans(hosts).hosts["@fake/a"].services[0]
    hosts[0][1]["fake_responses"] = {"@@modelfleet-state": owned_lines({kept.unit_name: render.render_unit(kept)})}
    state = fake.run_fake(hosts, lambda: pipeline.run_stages(retire_stage))
    assert len(fake.executed(state, "a")) == 1  # the one read of what is deployed


def as_cli(monkeypatch, hosts, deploy_func):
    """A run ordered as pyinfra's CLI orders it (by where each operation is called: the API's own mode orders by
    how many operations a host had before), then executed on @fake hosts."""
    import pyinfra
    from pyinfra.api import Config, Inventory, State
    from pyinfra.api.connect import connect_all, disconnect_all
    from pyinfra.api.operations import run_ops
    from pyinfra.api.state import StateStage
    from pyinfra.context import ctx_host, ctx_state

    monkeypatch.setattr(pyinfra, "is_cli", True)
    state = State(Inventory(([(f"@fake/{n}", {"fake_delay": 0, "fake_delay_jitter": 0, **d}) for n, d in hosts],
                             {})), Config())
    state.set_stage(StateStage.Connect)
    connect_all(state)
    state.set_stage(StateStage.Prepare)
    with ctx_state.use(state):
        for host in state.inventory.get_active_hosts():  # as pyinfra_cli.util.load_func does, one host in turn
            with ctx_host.use(host):
                deploy_func()
        state.set_stage(StateStage.Execute)
        try:
            run_ops(state)
        finally:
            disconnect_all(state)
    return state


def test_a_replica_dropped_from_the_front_door_leaves_the_router_before_its_unit_stops(fake, monkeypatch):
    before = plans([("r1", replica("127.0.0.1", 18011)), ("a", replica("127.0.0.2", 18012))])
    old = before.hosts["@fake/a"].services[0]
    # Host a now serves another pool, behind no front door: its replica of tiny-lab is no longer named.
    hosts = [("r1", replica("127.0.0.1", 18011)), ("a", {**replica("127.0.0.2", 18012), "router": None,
                                                         "router_bind_address": None, "pool": "solo",
                                                         "port": 18020})]
    rp = plans(hosts).routers["tiny-lab"]
    a_url = next(w.url for w in before.routers["tiny-lab"].workers if "127.0.0.2" in w.url)
    data = dict(hosts)
    data["r1"] = {**data["r1"], "fake_responses": {
        "@@modelfleet-state": state_lines(rp), router.list_command(rp): [workers_json([w.url for w in rp.workers]
                                                                                     + [a_url])]}}
    data["a"] = {**data["a"], "fake_responses": {"@@modelfleet-state": owned_lines(
        {old.unit_name: render.render_unit(old)})}}
    assert pipeline.SERVE.index(router_stage) < pipeline.SERVE.index(retire_stage)
    state = as_cli(monkeypatch, list(data.items()), lambda: pipeline.run_stages(router_stage, retire_stage))
    order = [sorted(state.get_op_meta(op).names) for op in state.get_op_order()]
    forget = next(i for i, names in enumerate(order) if any(n.endswith("| Replicas of front door tiny-lab")
                                                             for n in names))
    stop = next(i for i, names in enumerate(order) if any(n.endswith(f"| Retire {old.unit_name} (not in the "
                                                                       "inventory)") for n in names))
    assert forget < stop, order
    removed = router.remove_script(rp, a_url, "00000000-0000-0000-0000-000000000001")
    assert removed in fake.executed(state, "r1")
    assert f"systemctl disable --now -- {old.unit_name}" in fake.executed(state, "a")
