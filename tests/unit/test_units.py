"""What systemd merges into a unit modelfleet owns, judged from recorded DeployedState output (the fact cases):
which files are not modelfleet's, and whether removing them must restart the engine."""

from pathlib import Path

import yaml

from modelfleet.host.facts.state import DeployedState
from modelfleet.host.units import merged, what_it_sets

CASES = Path(__file__).resolve().parent.parent / "facts" / "state.DeployedState"
UNIT = "modelfleet-tiny-mflab1-1.service"


def recorded(case: str) -> dict:
    output = yaml.safe_load((CASES / f"{case}.yaml").read_text())["output"]
    return DeployedState().process(output.splitlines())["units"][UNIT]


def test_a_converged_unit_has_nothing_merged():
    assert merged(UNIT, recorded("unit_clean")).drift is False


def test_drop_ins_are_removed_and_the_one_changing_the_service_restarts_it():
    current = recorded("unit_dropins")
    found = merged(UNIT, current)
    assert found.foreign == tuple(current["DropInPaths"]) and found.reload and found.restart
    override, note = f"/etc/systemd/system/{UNIT}.d/override.conf", f"/etc/systemd/system/{UNIT}.d/10-note.conf"
    assert what_it_sets(UNIT, current, override) == "sets ExecStart, Restart"
    assert what_it_sets(UNIT, current, note) == "sets no [Service] setting"
    # A description only: removed and reloaded, the engine left running.
    only_note = {**current, "DropInPaths": [note]}
    assert merged(UNIT, only_note).foreign == (note,) and not merged(UNIT, only_note).restart


def test_a_masked_unit_is_unmasked_without_a_restart_of_what_runs():
    found = merged(UNIT, recorded("unit_masked"))
    assert found.masked and found.reload and not found.foreign and not found.restart


def test_a_unit_file_that_outranks_ours_and_a_pending_reload():
    current = {**recorded("unit_clean"), "FragmentPath": f"/run/systemd/system/{UNIT}"}
    found = merged(UNIT, current)
    assert found.foreign == (f"/run/systemd/system/{UNIT}",) and found.restart
    assert "instead of" in what_it_sets(UNIT, current, f"/run/systemd/system/{UNIT}")
    pending = merged(UNIT, {**recorded("unit_clean"), "NeedDaemonReload": "yes"})
    assert pending.reload and pending.restart and not pending.foreign


def test_drop_ins_for_every_service_are_the_systems():
    current = {**recorded("unit_clean"), "DropInPaths": ["/usr/lib/systemd/system/service.d/10-timeout-abort.conf"]}
    assert merged(UNIT, current).drift is False


def test_a_runs_pinned_services_are_worked_out_once_per_host(monkeypatch):
    """The same services as outside a run; in a run the registry is asked once per image (both hosts name the
    same), outside one once per look-up."""
    from pyinfra.api import Config, Inventory, State
    from pyinfra.context import ctx_state

    from modelfleet.base import registry
    from modelfleet.host import units
    from modelfleet.plan import pins
    from modelfleet.plan.checkpoint import Snapshot
    from modelfleet.plan.inventory import resolve

    asked = []

    def resolve_(image, insecure, config):
        asked.append(image)
        return "sha256:" + "1" * 64

    monkeypatch.setattr(registry, "_resolve", resolve_)
    monkeypatch.setattr(pins, "snapshot", lambda repo, revision, *_: Snapshot(repo=repo, revision=revision,
                                                                              commit="e" * 40, files={}))
    data = {"hardware": "h200", "gpu_count": 1, "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm"}
    result = resolve([("h1", data), ("h2", data)])
    outside = {name: units.pinned_services(plan) for name, plan in result.hosts.items()}
    assert len(asked) == 2 and all(s.image.endswith("@sha256:" + "1" * 64) for v in outside.values() for s in v)
    for _ in range(2):  # a new run asks again
        asked.clear()
        state = State(Inventory(([(name, data) for name in result.hosts], {})), Config())
        with ctx_state.use(state):
            for _again in range(3):
                assert {name: units.pinned_services(plan) for name, plan in result.hosts.items()} == outside
        assert len(asked) == 1  # once per image in each run


def test_a_converge_renders_each_unit_once(fake, monkeypatch, tmp_path):
    """serve's stages on a converged host: the service stage, the netcheck gate's pool_starts and the unit files'
    comparison all share one rendering of the unit and one of the engine's command line per form of it."""
    from modelfleet.plan import render
    from modelfleet.plan.inventory import resolve
    from modelfleet.run.pipeline import run_stages
    from modelfleet.run.stages import images, netcheck, preflight, service
    from tests.helpers.fake_hosts import b300_host, converged_replies

    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    calls = {"unit": 0, "argv": 0}
    unit, argv = render.render_unit, render.engine_argv

    def counted(kind, real):
        return lambda *a, **k: calls.__setitem__(kind, calls[kind] + 1) or real(*a, **k)

    monkeypatch.setattr(render, "render_unit", counted("unit", unit))
    monkeypatch.setattr(render, "engine_argv", counted("argv", argv))
    svc = resolve([("@fake/b1", b300_host())]).hosts["@fake/b1"].services[0]
    host = {**b300_host(), "fake_responses": converged_replies(fake, svc)}
    calls.update(unit=0, argv=0)  # from here: the run alone
    fake.run_fake([("b1", host)], lambda: run_stages(preflight, images, service, netcheck))
    assert calls == {"unit": 1, "argv": 2}  # the unit as run; the argv as pinned (its cache's key) and as run


def test_render_shows_the_runs_files_with_only_the_secret_masked(monkeypatch):
    """`modelfleet render` shows unit_files(mask=True): the files the run writes (same paths, modes, unit text),
    the key nowhere in them."""
    import secrets

    from modelfleet.host.units import unit_files
    from modelfleet.plan.inventory import resolve

    key = "k-" + secrets.token_hex(12)
    monkeypatch.setenv("MF_UNITS_KEY", key)
    for engine, recipe in (("vllm", "tiny-lab-vllm"), ("sglang", "tiny-lab-sglang")):
        result = resolve([("h", {"hardware": "lab-cpu", "model": "tiny-lab", "engine": engine, "recipe": recipe,
                                 "api_key_env": "MF_UNITS_KEY"})])
        assert not result.errors, result.errors
        svc = result.hosts["h"].services[0]
        run, shown = unit_files(svc), unit_files(svc, mask=True)
        assert [(p, m, s) for p, _, m, s in shown] == [(p, m, s) for p, _, m, s in run]
        assert shown[0][1] == run[0][1]  # the unit itself carries no secret
        assert any(key in content for _, content, _, _ in run)
        assert not any(key in content for _, content, _, _ in shown)


def test_a_rank_systemd_restarted_restarts_its_pool_and_a_service_on_one_host_never_counts():
    """systemd's NRestarts of a pool's rank (the real vLLM's restarted headless rank never rejoins): the rank's host
    says how often, and so the pool starts again; a service on one host restarted by systemd is only itself."""
    import hashlib

    from modelfleet.host import units
    from modelfleet.plan.inventory import resolve
    from tests.helpers.fake_hosts import b300_host

    digest = "vllm/vllm-openai:v0.34.0@sha256:" + "a" * 64
    pair = {"model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm-dp2", "pool": "pair",
            "hardware": "lab-cpu", "revision": "e" * 40, "image": digest}
    plans = resolve([("@fake/a", {**pair, "ssh_hostname": "192.0.2.1"}),
                     ("@fake/b", {**pair, "ssh_hostname": "192.0.2.2"})]).hosts
    worker = plans["@fake/b"]
    unit = worker.services[0].unit_name
    # the worker's files as the run writes them: nothing else would start it
    written = {path: {"kind": "file", "mode": mode[1:], "user": "root", "group": "root",
                      "sha256": hashlib.sha256(content.encode()).hexdigest()}
               for path, content, mode, _ in units.unit_files(units.pinned_services(worker)[0])}

    def state(**props):
        return {"paths": written, "units": {unit: {"ActiveState": "active", **props}}}

    assert units.rank_restarted(worker, state(NRestarts="2"), "pair") == 2
    assert units.rank_restarted(worker, state(NRestarts="0"), "pair") == 0
    assert units.rank_restarted(worker, state(), "pair") == 0  # a unit systemd does not know
    assert units.rank_restarted(worker, state(NRestarts="2"), "other") == 0
    assert not units.starts(worker, state(NRestarts="0"), "pair")
    assert units.starts(worker, state(NRestarts="1"), "pair")  # the gate and verify run again: the pool restarts
    # A rank that already caused FLAP_LIMIT pool restarts in a row is held out: the pool does not start for it.
    flaps = {units.flap_file(worker, "pair"): {"kind": "file", "mode": "644", "user": "root", "group": "root",
                                               "sha256": hashlib.sha256(f"{units.FLAP_LIMIT}\n".encode()).hexdigest()}}
    held = {"paths": {**written, **flaps}, "units": {unit: {"ActiveState": "active", "NRestarts": "1"}}}
    assert units.flap_count(worker, held, "pair") == units.FLAP_LIMIT and not units.starts(worker, held, "pair")
    assert units.flap_file(worker, "pair") in units.start_reads(worker)["paths"]
    single = resolve([("@fake/b300-01", b300_host())]).hosts["@fake/b300-01"]
    one = {"paths": {}, "units": {single.services[0].unit_name: {"ActiveState": "active", "NRestarts": "3"}}}
    assert units.rank_restarted(single, one, single.services[0].pool) == 0
