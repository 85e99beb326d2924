"""A unit modelfleet owns whole (operations/owned_unit.py), run through pyinfra's @fake connector from the unit's
state as the stages read it: the commands sent for a clean unit, a drop-in that changes what runs and one that
does not, a unit file that outranks ours, a mask; and a host that keeps its own drop-ins refused by file."""

from __future__ import annotations

import logging

import pytest
from pyinfra.api.exceptions import PyinfraError

from modelfleet.host.operations.owned_unit import owned_running, refused_when_kept, unmasked

UNIT = "modelfleet-k31.service"
OURS = f"/etc/systemd/system/{UNIT}"
DROPIN = f"/etc/systemd/system/{UNIT}.d/override.conf"
RUNNING = {"ActiveState": "active", "UnitFileState": "enabled", "LoadState": "loaded", "FragmentPath": OURS}


def converge(fake, current: dict, reload: bool = False, restart: bool = False) -> tuple[list[str], list[bool]]:
    """The commands the service stage's calls send for `current`, and what owned_running returned."""
    starts: list[bool] = []

    def deploy():
        extra = unmasked(UNIT, current)
        starts.append(owned_running(UNIT, current, extra, reload=reload, restart=restart))

    state = fake.run_fake([("gpu-01", {})], deploy)
    return fake.executed(state, "gpu-01"), starts


def test_a_clean_running_unit_gets_no_command(fake):
    assert converge(fake, RUNNING) == ([], [False])


def test_a_changed_unit_file_reloads_and_a_changed_config_restarts(fake):
    commands, starts = converge(fake, RUNNING, reload=True, restart=True)
    assert commands == ["systemctl daemon-reload", f"systemctl reset-failed {UNIT}", f"systemctl restart {UNIT}"]
    assert starts == [True]


def test_a_drop_in_that_changes_the_service_is_removed_and_the_unit_restarted(fake, caplog):
    current = {**RUNNING, "DropInPaths": [DROPIN], "dropins": {DROPIN: "[Service]\nEnvironment=X=1\nExecStart=\n"}}
    with caplog.at_level(logging.WARNING):
        commands, starts = converge(fake, current)
    assert commands == [f"rm -f -- {DROPIN}", f"rmdir --ignore-fail-on-non-empty -- {OURS}.d",
                        "systemctl daemon-reload", f"systemctl reset-failed {UNIT}", f"systemctl restart {UNIT}"]
    assert starts == [True]
    assert (f"modelfleet: {UNIT}: removing {DROPIN}, not written by modelfleet (sets Environment, ExecStart); "
            "restarting it on its own unit file") in caplog.text


def test_a_drop_in_that_sets_nothing_the_service_runs_is_removed_without_a_restart(fake):
    current = {**RUNNING, "DropInPaths": [DROPIN], "dropins": {DROPIN: "[Unit]\nDescription=site label\n"}}
    commands, starts = converge(fake, current)
    assert commands == [f"rm -f -- {DROPIN}", f"rmdir --ignore-fail-on-non-empty -- {OURS}.d",
                        "systemctl daemon-reload"]
    assert starts == [False]


def test_drop_ins_for_every_service_are_the_systems_not_drift(fake):
    system = "/usr/lib/systemd/system/service.d/10-timeout-abort.conf"
    assert converge(fake, {**RUNNING, "DropInPaths": [system], "dropins": {system: "[Service]\nTimeoutStopSec=9\n"}}) \
        == ([], [False])


def test_a_unit_file_that_outranks_ours_is_removed(fake):
    shadow = f"/run/systemd/system/{UNIT}"
    commands, starts = converge(fake, {**RUNNING, "FragmentPath": shadow})
    assert commands[:2] == [f"rm -f -- {shadow}", "systemctl daemon-reload"]
    assert commands[-1] == f"systemctl restart {UNIT}" and starts == [True]


def test_a_masked_unit_is_unmasked_before_anything_else_then_started(fake):
    current = {"ActiveState": "inactive", "UnitFileState": "masked", "LoadState": "masked", "FragmentPath": "/dev/null"}
    commands, starts = converge(fake, current)
    assert commands == [f"systemctl unmask --no-reload {UNIT}", f"systemctl unmask --runtime --no-reload {UNIT}",
                        "systemctl daemon-reload", f"systemctl enable {UNIT}", f"systemctl start {UNIT}"]
    assert starts == [True]


def test_a_failed_unit_is_reset_before_it_is_started_again(fake):
    commands, starts = converge(fake, {**RUNNING, "ActiveState": "failed"})
    assert commands == [f"systemctl reset-failed {UNIT}", f"systemctl start {UNIT}"] and starts == [True]


def test_a_host_that_keeps_its_drop_ins_is_refused_naming_each_file(fake, caplog):
    units = {UNIT: {**RUNNING, "DropInPaths": [DROPIN], "dropins": {DROPIN: "[Service]\nExecStart=/bin/other\n"}},
             "modelfleet-dcgm-exporter.service": {"ActiveState": "active"}}
    refused: list[bool] = []
    state = fake.run_fake([("gpu-01", {})], lambda: refused.append(refused_when_kept(True, units)), dry=True)
    with caplog.at_level(logging.ERROR), pytest.raises(PyinfraError, match="No hosts remaining"):
        fake.finish(state)
    assert refused == [True] and fake.executed(state, "gpu-01") == []
    assert (f"refused: {UNIT}: {DROPIN} sets ExecStart; this host keeps its own drop-ins (unit_dropins: keep), so "
            "modelfleet will not run the unit it would not own") in caplog.text


@pytest.mark.parametrize("keep, units", [
    (False, {UNIT: {**RUNNING, "DropInPaths": [DROPIN]}}),  # removed instead, by owned_running
    (True, {UNIT: RUNNING}),  # nothing foreign to keep
])
def test_nothing_is_refused_without_keep_or_without_a_foreign_file(fake, keep, units):
    refused: list[bool] = []
    fake.run_fake([("gpu-01", {})], lambda: refused.append(refused_when_kept(keep, units)))
    assert refused == [False]
