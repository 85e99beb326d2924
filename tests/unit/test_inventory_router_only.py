"""A host that runs only a front door (`router_only = True`): resolved on the catalog's `cpu` board with no
service and the front door its replicas name; refused, naming host and field, when it is also given an engine,
a GPU board, or no service names it; its router and proxy units are never retired as unnamed."""

import pytest

from modelfleet.plan import render, router
from modelfleet.plan.inventory import resolve, router_only
from modelfleet.run import retire
from modelfleet.run.stages import gpu_stack

KEY = "router-only-key-0123456"


def replica(address: str, fabric: str, **extra) -> dict:
    return {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "sglang", "recipe": "tiny-lab-sglang",
            "ssh_hostname": address, "fabric_address": fabric, "router": "gw", "api_key_env": "MF_RO_KEY", **extra}


def fleet(**gateway) -> list:
    return [("gw", {"router_only": True, "ssh_hostname": "10.0.0.9", **gateway}),
            ("a", replica("10.0.0.2", "10.1.0.2")), ("b", replica("10.0.0.3", "10.1.0.3"))]


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("MF_RO_KEY", KEY)


def test_a_router_only_host_runs_the_front_door_and_no_engine():
    result = resolve(fleet())
    assert result.errors == []
    gw = result.hosts["gw"]
    assert gw.hardware.id == router_only.BOARD and gw.hardware.gpus_per_node == 0 and gw.services == ()
    rp = result.routers["tiny-lab"]
    assert gw.routers == (rp,) and rp.host == "gw" and rp.bind_address == "10.0.0.9"
    # Every replica is off the router host: each on its own fabric address, none on loopback.
    assert [w.url for w in rp.workers] == ["http://10.1.0.2:30000", "http://10.1.0.3:30000"]
    assert not gpu_stack.managed(gw)  # no driver, toolkit nor Docker from the GPU stack
    assert "gw" not in {h for pool in result.pools.values() for h in pool.hosts}


@pytest.mark.parametrize("given, field, says", [
    ({"model": "tiny-lab"}, "model", "router_only is True: the host runs only front doors"),
    ({"services": [{"model": "tiny-lab", "engine": "sglang"}]}, "services", "serves no model"),
    ({"hardware": "h100"}, "hardware", "h100 has GPUs, but router_only is True"),
])
def test_a_router_only_host_with_an_engine_or_gpus_is_refused_naming_host_and_field(given, field, says):
    errors = resolve(fleet(**given)).errors
    assert [(w, f) for w, f, _ in errors if w == "host gw"] == [("host gw", field)], errors
    assert says in next(m for w, f, m in errors if f == field)


def test_a_router_only_host_no_service_names_is_refused():
    entries = [(n, {**d, "router": "a"} if n != "gw" else d) for n, d in fleet()]
    errors = [e for e in resolve(entries).errors if e[0] == "host gw"]
    assert errors == [("host gw", "router_only", "True, but no service names gw in `router`: it would run "
                                                 "nothing (set `router` on the services it fronts)")]


def test_a_host_with_neither_hardware_nor_router_only_still_misses_its_board():
    errors = resolve([("gw", {"ssh_hostname": "10.0.0.9"})]).errors
    assert ("host gw", "hardware", "missing") in errors


def test_a_site_board_without_gpus_is_accepted_for_a_router_only_host():
    errors = resolve(fleet(hardware="lab-cpu")).errors
    assert errors == []


def test_retire_keeps_the_front_door_units_of_a_router_only_host_and_retires_its_old_engine():
    result = resolve(fleet(router_tls_cert=None))
    gw, rp = result.hosts["gw"], result.routers["tiny-lab"]
    # The host served a replica before it became router-only: that engine's unit is retired, the doors kept.
    old = resolve([("gw", replica("10.0.0.9", "10.1.0.9")), ("a", replica("10.0.0.2", "10.1.0.2"))])
    engine = old.hosts["gw"].services[0]
    owned = {rp.unit_name: {"text": router.render_unit(rp), "ActiveState": "active", "UnitFileState": "enabled"},
             rp.proxy_unit_name: {"text": router.render_proxy_unit(rp), "ActiveState": "active",
                                  "UnitFileState": "enabled"},
             engine.unit_name: {"text": render.render_unit(engine), "ActiveState": "active",
                                "UnitFileState": "enabled"}}
    retired = retire.to_retire(owned, retire.named_units(gw), retire.kept_paths(gw))
    assert [r.unit for r in retired] == [engine.unit_name]
    assert not set(retired[0].files) & set(router.paths(rp).values())


def test_named_reads_router_from_host_data_and_services_entries():
    entries = [("x", {"router": "gw"}), ("y", {"services": [{"router": "gw2"}, "junk"]}), ("z", "not a dict")]
    assert router_only.named(entries) == {"gw", "gw2"}


def test_plan_of_a_router_only_host_says_it_sizes_nothing(tmp_path):
    from click.testing import CliRunner

    from modelfleet.cli import main

    inv = tmp_path / "inv.py"
    inv.write_text(f"hosts = {fleet()!r}\n")
    done = CliRunner().invoke(main, ["plan", str(inv), "gw"])
    assert (done.exit_code, done.output) == (0, "gw serves no model (router_only): nothing to size\n")


def test_render_of_a_router_only_host_is_its_front_doors_files_only(tmp_path):
    import json

    from click.testing import CliRunner

    from modelfleet.cli import main

    inv = tmp_path / "inv.py"
    inv.write_text(f"hosts = {fleet()!r}\n")
    done = CliRunner().invoke(main, ["render", "--json", str(inv), "gw"])
    assert done.exit_code == 0, done.output
    shown = json.loads(done.output)
    rp = resolve(fleet()).routers["tiny-lab"]
    assert {f["path"] for f in shown["files"]} == {f["path"] for f in router.preview(rp)[0]}
    assert KEY not in done.output
