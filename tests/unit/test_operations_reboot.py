"""Reboot and wait for a new boot (operations/reboot.py): under pyinfra's @fake connector, the order of what it
sends (the boot read before the reboot, the wait after) and a host whose boot cannot be read left unrebooted; its
reboot command run for real against a stand-in `systemctl`; and the boot token read through pyinfra's local
connector, checked against this machine's own boot id."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.exceptions import PyinfraError

from modelfleet.host.operations.reboot import boot_token, reboot_and_wait


def test_nothing_is_sent_when_no_reboot_is_needed(fake):
    state = fake.run_fake([("gpu-01", {})], lambda: reboot_and_wait(needed=False, reason="driver unchanged"))
    assert fake.executed(state, "gpu-01") == []


def planned_reboot(fake) -> list[str]:
    state = fake.run_fake([("gpu-01", {})], lambda: reboot_and_wait(needed=True, reason="new driver"), dry=True)
    return fake.planned(state, "gpu-01")


def test_the_boot_is_read_before_the_reboot_and_waited_for_after(fake):
    steps = planned_reboot(fake)
    assert len(steps) == 3 and (steps[0], steps[2]) == ("<capture>", "<wait>")
    assert "reboot" in steps[1]


@pytest.mark.slow
def test_the_reboot_command_returns_at_once_and_reboots_a_moment_later(fake, tmp_path):
    """Detached, so the SSH command that sends it ends cleanly before the connection drops."""
    called = tmp_path / "systemctl-called"
    (tmp_path / "systemctl").write_text(f'#!/bin/sh\necho "$@" > {called}\n')
    (tmp_path / "systemctl").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    started = time.monotonic()
    subprocess.run(["sh", "-c", planned_reboot(fake)[1]], env=env, check=True, timeout=5)
    assert time.monotonic() - started < 0.5 and not called.exists()
    deadline = time.monotonic() + 5
    while not called.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert called.read_text().split() == ["reboot"]


def test_a_host_whose_boot_cannot_be_read_is_not_rebooted(fake):
    host = {"fake_responses": {"boot_id": {"success": False, "stderr": "cat: /proc/sys/kernel/random/boot_id: denied"}}}
    state = fake.run_fake([("gpu-01", host)], lambda: reboot_and_wait(needed=True, reason="new driver"), dry=True)
    with pytest.raises(PyinfraError, match="No hosts remaining"):
        fake.finish(state)
    [read] = fake.executed(state, "gpu-01")  # the boot read, and nothing after it
    assert "boot_id" in read


def test_the_boot_token_is_this_machines_boot_id_and_init_start():
    inventory = Inventory((["@local"], {}))
    state = State(inventory, Config())
    connect_all(state)
    try:
        token = boot_token(inventory.get_host("@local"))
    finally:
        disconnect_all(state)
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    init_start = Path("/proc/1/stat").read_text().rsplit(")", 1)[1].split()[19]  # field 22: starttime
    assert token == f"{boot_id} {init_start}"
