"""Stage preflight: a host with too few GPUs and an old driver refused before any later stage, the recorded H200
judged, Fabric Manager against the loaded driver."""

import json

import pytest
from pyinfra.api.exceptions import PyinfraError

from modelfleet.host.facts.probe import HostProbe
from modelfleet.plan.inventory import resolve
from modelfleet.run.stages import preflight
from tests.helpers.fake_hosts import B300_GPUS, B300_VERSIONS, FM, b300_host, b300_probe, h200_probe, serve


@pytest.fixture(autouse=True)
def reports(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    return tmp_path / "preflight"


def test_preflight_refuses_a_host_with_too_few_gpus_and_old_driver(fake, reports):
    old = [line.replace("580.95.05", "570.158.01") for line in B300_VERSIONS]
    host = {**b300_host(), "fake_responses": {"@@modelfleet-probe": b300_probe(fake, B300_GPUS[:7], old)}}
    state = fake.run_fake([("b300-01", host)], serve, dry=True)
    with pytest.raises(PyinfraError, match="No hosts remaining"):
        fake.finish(state)
    commands = fake.executed(state, "b300-01")
    assert not any(c.startswith("docker pull") for c in commands)  # later stages never added
    report = json.loads((reports / "_fake_b300-01.json").read_text())
    assert not report["ok"]
    joined = "\n".join(report["problems"])
    assert "GPU count: inventory says 8x b300, host has 7" in joined
    assert "driver 570.158.01 < 580" in joined


def test_preflight_on_recorded_h200_accepts_small_model_and_refuses_kimi(fake):
    plan = resolve([("h200", {"hardware": "h200", "gpu_count": 1, "model": "qwen3-8b", "engine": "vllm",
                              "assess_models": ["kimi-k3.1-pro", "qwen3-8b"]})]).hosts["h200"]
    report = preflight.evaluate(plan, h200_probe(fake))
    assert report["ok"], report["problems"]
    assert report["gpus"] == [{"name": "NVIDIA H200", "memory_total_mib": 143771}]
    assert (report["driver"], report["cuda"]) == ("580.159.04", "13.0")
    assert report["kernel_module"] == {"version": "580.159.04", "open": True, "arch": "x86_64"}
    verdicts = {a["model"]: a for a in report["assessed"]}
    assert not verdicts["kimi-k3.1-pro"]["fits"] and "1x h200" in verdicts["kimi-k3.1-pro"]["reason"]
    assert verdicts["qwen3-8b"]["fits"]


@pytest.mark.parametrize("fm, problem", [
    (["nvswitches=4"], "Fabric Manager: not installed; b300 with NVSwitch needs nvidia-fabricmanager "
                       "at the driver's version (580.95.05)"),
    (["nvswitches=4", "Fabric Manager version is : 590.48.01"],
     "Fabric Manager 590.48.01 does not match driver 580.95.05 (the usual cause of CUDA error 802)"),
    (FM, None),
])
def test_preflight_checks_fabric_manager_against_the_driver(fake, fm, problem):
    plan = resolve([("b300-01", b300_host())]).hosts["b300-01"]
    report = preflight.evaluate(plan, HostProbe().process(b300_probe(fake, fabric_manager=fm)))
    matching = [p for p in report["problems"] if p.startswith("Fabric Manager")]
    assert (matching[0].startswith(problem) if problem else not matching), report["problems"]


def test_a_single_gpu_of_an_nvswitch_board_needs_no_fabric_manager():
    plan = resolve([("h200", {"hardware": "h200", "gpu_count": 1, "model": "qwen3-8b",
                              "engine": "vllm"})]).hosts["h200"]
    assert preflight.fabric_manager_problems(plan, {"fabric_manager": {"nvswitches": 0, "version": None}}) == []
