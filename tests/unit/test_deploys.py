"""The entry points (deploys.py) through pyinfra's @fake connector: a host whose pins cannot be resolved is refused
with one line per pin before any stage runs, each entry point asking only for the pins its stages use; entry
points that need none run with the registry and the checkpoint source out of reach: the registry a loopback port
nothing listens on, the checkpoint mirror (`model_source`) an empty folder."""

from __future__ import annotations

import logging
import socket

import pytest
from pyinfra.api.exceptions import PyinfraError

from modelfleet.run import deploys


@pytest.fixture(autouse=True)
def reports(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path / "reports"))


@pytest.fixture()
def mirror(tmp_path):
    (tmp_path / "mirror").mkdir()
    return tmp_path / "mirror"


@pytest.fixture(scope="module")
def closed_port():
    """A loopback port bound but never listening: a connection there is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def h200(fake, closed_port, mirror, **data) -> dict:
    """A 1x H200 host, as recorded, serving Qwen3-8B; its registry unreachable, its mirror empty."""
    reply = fake.probe_reply({
        "nvidia_gpus": fake.recorded(fake.H200 / "nvidia-smi-query-gpu-header.txt"),
        "nvidia_versions": fake.recorded(fake.H200 / "nvidia-smi-version.txt"),
        "nvidia_module": fake.recorded(fake.H200 / "proc-driver-version.txt"),
        "os": fake.recorded(fake.H200 / "os-release.txt"), "ports": [],
        "disk": ["Filesystem 1-blocks Used Available Capacity Mounted on",
                 "/dev/vda 270553174016 17286574080 68702363648 21% /"]})
    return {"hardware": "h200", "gpu_count": 1, "model": "qwen3-8b", "engine": "vllm", "gpu_stack": False,
            "revision": "c" * 40, "image_registry": f"127.0.0.1:{closed_port}",
            "model_source": f"file://{mirror}", "fake_responses": {"@@modelfleet-probe": reply}, **data}


def refusals(fake, caplog, host: dict, entry) -> tuple[list[str], list[str]]:
    """(each `refused:` line the run logged, the commands the host was sent)."""
    state = fake.run_fake([("gpu-01", host)], entry, dry=True)
    with caplog.at_level(logging.ERROR, logger="pyinfra"):
        try:
            fake.finish(state)
        except PyinfraError:
            pass
    lines = [r.getMessage().split("refused: ", 1)[1] for r in caplog.records if "refused: " in r.getMessage()]
    return lines, fake.executed(state, "gpu-01")


def test_a_host_whose_pins_fail_gets_one_line_per_pin_and_no_stage(fake, caplog, closed_port, mirror):
    lines, sent = refusals(fake, caplog, h200(fake, closed_port, mirror), deploys.prefetch)
    assert sent == []  # not even the stages' reads
    assert [line.split(":", 1)[0] for line in lines] == ["image digest", "checkpoint revision"]
    assert lines[0].startswith(f"image digest: 127.0.0.1:{closed_port}/") and "Connection refused" in lines[0]
    assert "Qwen/Qwen3-8B" in lines[1]
    assert lines[1].endswith("check hf_endpoint / model_source and the token, then re-run")


def test_an_entry_point_asks_only_for_the_pins_its_stages_use(fake, caplog, closed_port, mirror):
    lines, sent = refusals(fake, caplog, h200(fake, closed_port, mirror), deploys.model)  # the checkpoint, no image
    assert [line.split(":", 1)[0] for line in lines] == ["checkpoint revision"] and sent == []


@pytest.mark.parametrize("entry", [deploys.preflight, deploys.storage])
def test_entry_points_that_use_no_pin_run_with_the_registry_and_mirror_out_of_reach(fake, caplog, closed_port,
                                                                                   mirror, entry):
    lines, sent = refusals(fake, caplog, h200(fake, closed_port, mirror), entry)
    assert lines == []
    if entry is deploys.preflight:
        assert len(sent) == 1 and sent[0].startswith("echo '@@modelfleet-probe ")  # its one round trip


def test_a_missing_checkpoint_refuses_the_host_also_when_the_revision_is_a_commit(fake, caplog, closed_port,
                                                                                 mirror):
    lines, sent = refusals(fake, caplog, h200(fake, closed_port, mirror, revision="c" * 40), deploys.model)
    assert [line.split(":", 1)[0] for line in lines] == ["checkpoint revision"] and sent == []
