"""modelfleet.run.retire: which units of a host are modelfleet's and no longer named, and what each one's file says
it runs (read from the units modelfleet really renders); the DeployedState's `owned` read in a real shell lists
only the files with modelfleet's mark; a host the inventory still holds is refused by the retire command."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace

import pytest

from modelfleet import PACKAGE_DIR
from modelfleet.host.facts.state import OWNED_MARK, DeployedState
from modelfleet.plan import render, router
from modelfleet.plan.inventory import resolve
from modelfleet.run import retire
from modelfleet.run.stages import exporters


def service(fabric: str, port: int, engine: str = "sglang", **extra) -> dict:
    return {"hardware": "lab-cpu", "model": "tiny-lab", "engine": engine, "recipe": f"tiny-lab-{engine}",
            "port": port, "router": "@fake/r1", "router_bind_address": "127.0.0.1", "api_key_env": "MF_RETIRE_KEY",
            "fabric_address": fabric, **extra}


@pytest.fixture
def resolved(monkeypatch):
    monkeypatch.setenv("MF_RETIRE_KEY", "retire-test-key-0123")
    result = resolve([("@fake/r1", service("127.0.0.1", 18011, "vllm")),
                      ("@fake/a", service("127.0.0.2", 18012, "vllm"))])
    assert result.errors == []
    return result


def found(text: str) -> dict:
    return {"text": text, "ActiveState": "active", "UnitFileState": "enabled"}


def test_every_unit_modelfleet_writes_starts_with_its_mark():
    templates = sorted((PACKAGE_DIR / "templates").glob("*.service.j2"))
    assert len(templates) >= 4
    assert all(t.read_text().splitlines()[0] == OWNED_MARK for t in templates)


def test_an_engine_unit_says_its_pool_container_files_port_and_checkpoint(resolved):
    svc = resolved.hosts["@fake/a"].services[0]
    r = retire.described(svc.unit_name, found(render.render_unit(svc)))
    assert r.what == f"pool {svc.pool}" and r.container == svc.container_name and r.port == svc.port
    assert r.files == (svc.env_file, svc.secrets_config_file, svc.auth_file)
    assert r.checkpoint == svc.model_dir and (r.active, r.enabled) == ("active", "enabled")
    # An unpinned directory is never removed; a pinned revision's takes its model's directory with it.
    assert "checkpoint kept at" in r.line(remove_checkpoint=True) and not retire.removable(r.checkpoint)
    pinned = retire.described(svc.unit_name, found(render.render_unit(svc.at_commit("a" * 40))))
    assert "checkpoint kept at" in pinned.line() and "checkpoint removed at" in pinned.line(remove_checkpoint=True)
    assert retire.removable(pinned.checkpoint) and not retire.removable("/" + "a" * 40)


def test_an_ollama_unit_says_its_modelfile_too(monkeypatch):
    """Ollama's unit registers its checkpoint from `<config_dir>/<pool>.Modelfile`: retired with the unit."""
    svc = resolve([("h1", {"hardware": "h200", "gpu_count": 1, "model": "tiny-lab", "engine": "ollama",
                           "recipe": "tiny-lab-ollama", "gpus": 1})]).hosts["h1"].services[0]
    r = retire.described(svc.unit_name, found(render.render_unit(svc)))
    assert r.files == (svc.env_file, svc.secrets_config_file, svc.auth_file, render.modelfile_path(svc))


def test_a_front_door_router_and_proxy_unit_say_their_files(resolved):
    rp = resolved.routers["tiny-lab"]
    p = router.paths(rp)
    r = retire.described(rp.unit_name, found(router.render_unit(rp)))
    assert r.what == f"front door {rp.name}" and r.container is None and r.checkpoint is None
    assert r.files == (p["config"], p["workers"], p["key"], p["admin"], p["admin_auth"], p["rule"])
    proxy = retire.described(rp.proxy_unit_name, found(router.render_proxy_unit(rp)))
    assert proxy.files == (p["proxy"], p["proxy_key"], p["tls_cert"], p["tls_key"])


def test_the_exporter_unit_says_its_container(resolved, monkeypatch):
    monkeypatch.setattr(exporters, "pinned", lambda image: image + "@sha256:" + "0" * 64)  # no registry here
    plan = resolved.hosts["@fake/a"]
    r = retire.described(exporters.UNIT, found(exporters.dcgm_unit(plan)))
    assert r.container == exporters.CONTAINER and r.what.startswith("modelfleet DCGM exporter") and r.files == ()


def test_only_owned_units_the_plan_does_not_name_are_retired_and_never_a_file_it_uses(resolved):
    r1, a = resolved.hosts["@fake/r1"], resolved.hosts["@fake/a"]
    rp = resolved.routers["tiny-lab"]
    assert retire.named_units(r1) >= {r1.services[0].unit_name, rp.unit_name, rp.proxy_unit_name}
    # A replica's unit under its pool's old name is the service stage's to retire (it replaces it).
    assert retire.named_units(a) == {a.services[0].unit_name, a.services[0].legacy_unit_name}
    # A unit of a pool the host no longer serves, whose file names the env file its current unit uses.
    gone = replace(a.services[0], unit_stem="", pool="gone")
    text = render.render_unit(gone).replace(gone.env_file, a.services[0].env_file)
    owned = {a.services[0].unit_name: found(render.render_unit(a.services[0])), gone.unit_name: found(text)}
    (r,) = retire.to_retire(owned, retire.named_units(a), retire.kept_paths(a))
    assert r.unit == "modelfleet-gone.service"
    # Every file it names is one the host's current unit uses (its env file, and the secrets and auth files
    # beside it): none is removed; without the plan's files they would all be.
    assert r.files == ()
    assert retire.to_retire(owned, retire.named_units(a))[0].files == (
        a.services[0].env_file, a.services[0].secrets_config_file, a.services[0].auth_file)


def test_a_host_still_in_the_inventory_is_refused_by_name_or_address(resolved):
    from modelfleet.base import targets

    resolved.hosts["@fake/a"] = replace(resolved.hosts["@fake/a"], address="10.0.0.7")
    assert len(targets.still_served(resolved, [targets.target(t) for t in ("10.0.0.7", "@ssh/10.0.0.7")])) == 2
    assert targets.still_served(resolved, [targets.target("10.0.0.8")]) == []


def test_the_host_lists_only_unit_files_with_the_mark(tmp_path):
    """The DeployedState's `owned` part, run in a real shell over a unit directory."""
    (tmp_path / "modelfleet-gone.service").write_text(f"{OWNED_MARK}\n# pool gone · recipe r\n[Service]\n")
    (tmp_path / "modelfleet-mine.service").write_text("[Service]\nExecStart=/bin/true\n")  # a user's
    (tmp_path / "modelfleet-copy.service").write_text(f"# a note\n{OWNED_MARK}\n")  # the mark, not first
    (tmp_path / "other.service").write_text(f"{OWNED_MARK}\n")  # not named like modelfleet's
    fact = DeployedState()
    out = subprocess.run(["sh", "-c", fact.command(owned=(str(tmp_path),))], capture_output=True, text=True)
    owned = fact.process(out.stdout.splitlines())["owned"][str(tmp_path)]
    assert list(owned) == ["modelfleet-gone.service"]
    assert owned["modelfleet-gone.service"]["text"] == (tmp_path / "modelfleet-gone.service").read_text()
    assert retire.to_retire(owned)[0].what == "pool gone"


def test_the_retire_command_refuses_a_host_the_inventory_holds_before_connecting(tmp_path):
    from click.testing import CliRunner

    from modelfleet.cli import main

    inv = tmp_path / "inv.py"
    host = {"hardware": "h200", "gpu_count": 1, "model": "qwen3-8b", "engine": "vllm", "gpu_stack": False,
            "revision": "0" * 40, "ssh_hostname": "10.9.8.7"}
    inv.write_text(f"gpus = {[('g1', host)]!r}\n")
    for target in ("g1", "10.9.8.7", "@ssh/10.9.8.7"):
        out = CliRunner().invoke(main, ["retire", str(inv), target, "--dry"])
        assert out.exit_code == 2 and f"modelfleet retire: {target} reaches host g1 of the inventory" in out.output
        assert out.exception is None or isinstance(out.exception, SystemExit)
    bad = CliRunner().invoke(main, ["retire", str(inv), "10.9.8.6", "--ssh-port", "0"])
    assert bad.exit_code == 2 and "--ssh-port" in bad.output
    broken = tmp_path / "broken.py"
    broken.write_text(f"gpus = {[('g1', {**host, 'gpu_count': 'many'})]!r}\n")
    out = CliRunner().invoke(main, ["retire", str(broken), "10.9.8.6"])
    assert out.exit_code == 2 and "gpu_count" in out.output


def test_a_host_out_of_the_inventory_loses_every_marked_unit_and_says_so_while_planning(fake, resolved, tmp_path,
                                                                                       monkeypatch):
    """modelfleet.run.deploys.retire on a @fake host: what it would retire written where the command reads it (also
    under --dry), and with --remove-checkpoints the model directory of a pinned revision removed."""
    from modelfleet.host.units import UNIT_DIR
    from modelfleet.run import deploys

    svc = resolved.hosts["@fake/a"].services[0].at_commit("b" * 40)
    lines = [f"@@modelfleet-state owned {UNIT_DIR}", f"unit {svc.unit_name}", "ActiveState=active"]
    lines += [f"= {line}" for line in render.render_unit(svc).splitlines()]
    monkeypatch.setenv(retire.PLAN_ENV, str(tmp_path))
    monkeypatch.setenv(retire.CHECKPOINTS_ENV, "1")
    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path / "reports"))
    state = fake.run_fake([("gone", {"fake_responses": {"@@modelfleet-state": lines}})], deploys.retire)
    (said,) = tmp_path.glob("*.json")
    assert [r["unit"] for r in json.loads(said.read_text())["retired"]] == [svc.unit_name]
    commands = fake.executed(state, "gone")
    assert f"systemctl disable --now -- {svc.unit_name}" in commands
    assert f"rm -rf -- {svc.model_dir.rsplit('/', 1)[0]}" in commands
