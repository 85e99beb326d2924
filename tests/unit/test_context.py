"""The run context (modelfleet.run.context): each stage sees only the deployed state its wants() declares, read once
per host for all stages; a read it did not declare fails naming the stage and the item, for every stage of
serve.py; the stage running now and what follows it."""

from __future__ import annotations

import json
import shlex

import pytest

from modelfleet.base.host_commands import MANIFEST
from modelfleet.plan.inventory import resolve
from modelfleet.run import context, pipeline
from modelfleet.run.context import UndeclaredRead, _Declared
from modelfleet.run.stages import gpu_stack, service
from tests.helpers.fake_hosts import B300_GPUS, B300_VERSIONS, DF, IMAGE, PIN

HOST = {"hardware": "b300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": PIN, "pool": "k31",
        "served_name": "kimi-local", "image": IMAGE, "admission": False, "dcgm_exporter": True,
        "dcgm_exporter_image": "nvcr.io/nvidia/k8s/dcgm-exporter:4.4.2-4.7.1-ubuntu22.04@sha256:" + "d" * 64}
# The serving stages a @fake host can plan (verify and the router ask real endpoints while planning).
STAGES = tuple(s for s in pipeline.SERVE if s.NAME not in ("verify", "router"))


@pytest.fixture(autouse=True)
def reports(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    # The checkpoint's listing from a mirror folder, as `modelfleet mirror` writes it (the hub is not reached).
    folder = tmp_path / "mirror" / "moonshotai" / "Kimi-K3.1-Pro" / PIN
    folder.mkdir(parents=True)
    (folder / MANIFEST).write_text(json.dumps({"repo": "moonshotai/Kimi-K3.1-Pro", "commit": PIN, "files": {
        "config.json": {"size": 2, "sha256": "0" * 64}}}))
    HOST["model_source"] = f"file://{tmp_path / 'mirror'}"


def replies(fake) -> dict:
    svc = resolve([("@fake/b1", HOST)]).hosts["@fake/b1"].services[0]
    os_lines = fake.recorded(fake.H200 / "os-release.txt") + ["KERNEL_RELEASE=6.8.0-87-generic", "MACHINE_ARCH=x86_64"]
    fabric_manager = ["nvswitches=0", "Fabric Manager version is : 580.95.05"]
    return {"@@modelfleet-probe": fake.probe_reply({"os": os_lines, "nvidia_gpus": B300_GPUS,
                                                     "nvidia_versions": B300_VERSIONS, "disk": DF, "ports": [],
                                                     "fabric_manager": fabric_manager}),
            "@@modelfleet-state": [f"@@modelfleet-state tree {svc.model_dir}", "free 100000000000000",
                                   f"@@modelfleet-state unit {svc.unit_name}", "ActiveState=active",
                                   "@@modelfleet-state path /etc/modelfleet", "dir 700 root root -"]}


def planned_reads(fake, monkeypatch, stages=STAGES) -> dict[str, list[tuple[str, str]]]:
    """stage name -> the (kind, item) it read of the deployed state, in a dry run of `stages` on one host."""
    reads: dict[str, list[tuple[str, str]]] = {}
    check = _Declared._check

    def recorded(self, key):
        check(self, key)
        stage, kind, _ = self._where
        reads.setdefault(stage, []).append((kind, key))

    monkeypatch.setattr(_Declared, "_check", recorded)
    fake.run_fake([("b1", {**HOST, "fake_responses": replies(fake)})], lambda: pipeline.run_stages(*stages), dry=True)
    monkeypatch.setattr(_Declared, "_check", check)
    return reads


def test_every_stage_that_reads_the_host_fails_naming_itself_and_the_item_when_its_declaration_lacks_it(
        fake, monkeypatch):
    reads = planned_reads(fake, monkeypatch)
    assert {"gpu_stack", "model", "engine_cache", "images", "service", "exporters", "netcheck"} <= set(reads), reads
    for stage in STAGES:
        if stage.NAME not in reads:
            continue
        kind, item = reads[stage.NAME][0]
        declared = stage.wants

        def less(plan, probe, declared=declared, kind=kind, item=item):
            wants = declared(plan, probe)
            return {**wants, kind: [x for x in wants.get(kind, ()) if x != item]}

        with monkeypatch.context() as patch:
            patch.setattr(stage, "wants", less)
            with pytest.raises(UndeclaredRead) as refused:
                fake.run_fake([("b1", {**HOST, "fake_responses": replies(fake)})],
                              lambda: pipeline.run_stages(*STAGES), dry=True)
        assert f"stage {stage.NAME} reads {kind} {item!r} of host @fake/b1" in str(refused.value)


def test_the_host_is_read_once_for_all_stages(fake):
    state = fake.run_fake([("b1", {**HOST, "fake_responses": replies(fake)})],
                          lambda: pipeline.run_stages(*STAGES), dry=True)
    commands = fake.executed(state, "b1")  # what planning asked: the probe, then the deployed state, once
    assert len(commands) == 2 and "@@modelfleet-probe" in commands[0] and "MARK=@@modelfleet-state" in commands[1]
    plan = resolve([("@fake/b1", HOST)]).hosts["@fake/b1"]
    for stage in STAGES:  # and it asked for everything each stage declares
        for kind, items in stage.wants(plan, {}).items():
            arg = kind if kind == "owned" else kind[:-1]  # the shell program's KIND=VALUE
            assert kind == "probe" or all(shlex.quote(f"{arg}={item}") in commands[1] for item in items)


def test_a_view_hides_what_another_stage_declared():
    view = _Declared({"/a": {"kind": "file"}, "/b": None}, {"/a"}, "images", "paths", "h1")
    assert view.get("/a") == {"kind": "file"} and dict(view) == {"/a": {"kind": "file"}} and len(view) == 1
    with pytest.raises(UndeclaredRead, match="stage images reads paths '/b' of host h1"):
        view.get("/b")
    with pytest.raises(UndeclaredRead):
        "/b" in view  # noqa: B015


def test_the_stage_running_now_and_what_follows_it(fake, monkeypatch):
    seen = {}

    def spy(ctx):
        seen[ctx.stage.NAME] = (ctx.followed(), ctx.runs("service"), ctx.alone)

    for stage in (gpu_stack, service):
        monkeypatch.setattr(stage, "run", spy)
    fake.run_fake([("b1", {**HOST, "fake_responses": replies(fake)})],
                  lambda: pipeline.run_stages(gpu_stack, service), dry=True)
    assert seen == {"gpu_stack": (True, True, False), "service": (False, False, False)}


def test_a_read_outside_a_stage_is_refused(fake):
    def outside():
        context.host_run(()).deployed()

    with pytest.raises(UndeclaredRead, match="outside a stage"):
        fake.run_fake([("b1", {**HOST, "fake_responses": replies(fake)})], outside, dry=True)
