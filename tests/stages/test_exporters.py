"""Stage exporters: the DCGM exporter's unit on an NVIDIA host when asked, a drop-in on it removed (or refused
where the host keeps its own)."""

import hashlib

import pytest
from pyinfra.api.exceptions import PyinfraError

from modelfleet.plan.inventory import resolve
from modelfleet.run.pipeline import run_stages
from modelfleet.run.stages import exporters, preflight
from tests.helpers.fake_hosts import b300_host, b300_probe


@pytest.fixture(autouse=True)
def reports(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    return tmp_path / "preflight"


def test_dcgm_exporter_unit_on_an_nvidia_host_when_asked(fake, uploads, monkeypatch):

    dcgm = "nvcr.io/nvidia/k8s/dcgm-exporter:4.4.2-4.7.1-ubuntu22.04@sha256:" + "d" * 64
    host = {**b300_host(), "dcgm_exporter": True, "dcgm_exporter_image": dcgm, "fabric_address": "10.0.0.7",
            "fake_responses": {"@@modelfleet-probe": b300_probe(fake)}}
    state = fake.run_fake([("b300-01", host)], lambda: run_stages(preflight, exporters))
    unit = uploads.files["/etc/systemd/system/modelfleet-dcgm-exporter.service"]
    assert "--device nvidia.com/gpu=all" in unit and "--cap-add SYS_ADMIN" in unit and dcgm in unit
    assert "--address 10.0.0.7:9400" in unit
    commands = fake.executed(state, "b300-01")
    assert "systemctl enable modelfleet-dcgm-exporter.service" in commands
    assert "systemctl start modelfleet-dcgm-exporter.service" in commands


EXPORTER = "modelfleet-dcgm-exporter.service"
OVERRIDE = f"/etc/systemd/system/{EXPORTER}.d/override.conf"


def exporter_with_a_drop_in(fake, uploads, **data):
    """The DCGM exporter's unit as modelfleet wrote it, active, plus a drop-in that replaces its command; the
    commands the run sent, what it uploaded, and whether it failed."""
    host = {**b300_host(), "dcgm_exporter": True, "fabric_address": "10.0.0.7", **data,
            "dcgm_exporter_image": "nvcr.io/nvidia/k8s/dcgm-exporter:4.4.2-4.7.1-ubuntu22.04@sha256:" + "d" * 64}
    plan = resolve([("b300-01", host)]).hosts["b300-01"]
    unit = exporters.dcgm_unit(plan)
    state_reply = [
        f"@@modelfleet-state path {exporters.UNIT_PATH}",
        f"file 644 root root {hashlib.sha256(unit.encode()).hexdigest()}",
        f"@@modelfleet-state unit {EXPORTER}", "LoadState=loaded", "ActiveState=active", "UnitFileState=enabled",
        f"FragmentPath={exporters.UNIT_PATH}", f"DropInPaths={OVERRIDE}", "NeedDaemonReload=no",
        f"@@modelfleet-state dropin {EXPORTER} {OVERRIDE}", "= [Service]", "= ExecStart=", "= ExecStart=/bin/true"]
    host["fake_responses"] = {"@@modelfleet-probe": b300_probe(fake), "@@modelfleet-state": state_reply}
    state = fake.run_fake([("b300-01", host)], lambda: run_stages(preflight, exporters), dry=True)
    try:
        fake.finish(state)
        failed = False
    except PyinfraError:
        failed = True
    return fake.executed(state, "b300-01"), uploads, failed


def test_a_drop_in_on_the_exporter_unit_is_removed_and_the_exporter_restarted(fake, uploads):
    commands, uploads, failed = exporter_with_a_drop_in(fake, uploads)
    assert not failed and exporters.UNIT_PATH not in uploads.files  # its own file is unchanged
    removed = commands.index(f"rm -f -- {OVERRIDE}")
    assert removed < commands.index("systemctl daemon-reload") < commands.index(f"systemctl restart {EXPORTER}")


def test_a_drop_in_on_the_exporter_unit_is_refused_where_the_host_keeps_its_own(fake, uploads):
    commands, uploads, failed = exporter_with_a_drop_in(fake, uploads, unit_dropins="keep")
    assert failed and not uploads.files
    assert not [c for c in commands if c.startswith(("systemctl", "rm "))], commands  # only the reads ran
