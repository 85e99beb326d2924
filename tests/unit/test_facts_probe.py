"""Preflight's one round trip (facts/probe.py): its command run for real on this machine and read back, part by
part, against what the machine says of itself; the recorded H200 host's replies; and the isolation that keeps a
missing tool or a garbled part from spoiling the others."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from modelfleet.host.facts.probe import HostProbe


def run_here(**kwargs) -> dict:
    command = HostProbe().command(**kwargs)
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30, check=True).stdout
    return HostProbe().process(out.splitlines())


def os_release() -> dict:
    pairs = (line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line)
    return {k: v.strip('"') for k, v in pairs}


def test_the_command_run_here_reads_this_machine(tmp_path):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        facts = run_here(model_root=str(tmp_path))
    assert facts["os"]["id"] == os_release()["ID"] and facts["os"]["version_id"] == os_release().get("VERSION_ID")
    mem = re.search(r"^MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    assert facts["mem_total_kib"] == int(mem.group(1))
    if shutil.which("ss"):
        assert {"address": "127.0.0.1", "port": port} in [{k: p[k] for k in ("address", "port")}
                                                           for p in facts["ports"]]
    usage = shutil.disk_usage(tmp_path)
    assert facts["disk"]["size"] == usage.total
    if not shutil.which("nvidia-smi"):  # a missing tool spoils only its own part
        assert facts["nvidia_gpus"] is None and facts["nvidia_versions"] is None
    assert facts["gpu_health"] is None and facts["fabric"] is None  # not asked


def test_health_and_fabric_ride_along_only_when_asked():
    plain, asked = HostProbe().command(), HostProbe().command(health=True, fabric=True)
    assert "@@modelfleet-probe gpu_health" not in plain and "@@modelfleet-probe fabric'" not in plain
    assert "echo '@@modelfleet-probe gpu_health'" in asked and "echo '@@modelfleet-probe fabric'" in asked
    assert asked.startswith(plain.split("; echo '@@modelfleet-probe gpu_health'")[0])


def test_the_recorded_h200_host_reads_as_one_gpu_on_ubuntu(fake):
    h200 = fake.H200
    reply = fake.probe_reply({
        "nvidia_gpus": fake.recorded(h200 / "nvidia-smi-query-gpu-header.txt"),
        "block_devices": fake.recorded(h200 / "lsblk-json.txt"),
        "os": fake.recorded(h200 / "os-release.txt"),
        "mem_total_kib": fake.recorded(h200 / "meminfo.txt"),
        "amd_gpus": None,  # rocm-smi missing: its part failed
    })
    facts = HostProbe().process(reply)
    [gpu] = facts["nvidia_gpus"]
    assert (gpu["name"], gpu["memory_total_mib"], gpu["driver_version"]) == ("NVIDIA H200", 143771, "580.159.04")
    assert "/dev/vda" in [d["path"] for d in facts["block_devices"]]
    assert (facts["os"]["id"], facts["os"]["version_id"]) == ("ubuntu", "24.04")
    assert facts["mem_total_kib"] == 131961788
    assert facts["amd_gpus"] is None and facts["ports"] is None  # failed, and not in the reply at all


def test_a_garbled_part_is_none_and_the_rest_still_read(fake):
    reply = ["stray line before any marker"] + fake.probe_reply({
        "block_devices": ["{not json"],
        "mem_total_kib": ["MemTotal:       1024 kB"],
    })
    facts = HostProbe().process(reply)
    assert facts["block_devices"] is None and facts["mem_total_kib"] == 1024


@pytest.mark.parametrize("rc", ["rc=1", "rc=127"])
def test_a_part_that_exits_non_zero_is_none_even_with_output(fake, rc):
    reply = fake.probe_reply({"mem_total_kib": ["MemTotal:       1024 kB"]})
    reply[-1] = f"@@modelfleet-probe {rc}"
    assert HostProbe().process(reply)["mem_total_kib"] is None
