"""What the Debian family makes the GPU stack send to a host, byte for byte, as recorded before the OS seam's
contract was reworded (tests/fixtures/os-debian-golden.json): for every Debian/Ubuntu release catalog/os.yaml
lists and each architecture, the repository files with their content, keys, package install and hold commands,
the package-state query, the reboot check and the unattended-upgrades file, as a dry run plans them; the URLs
`modelfleet urls` lists for them; and status's host record. A change here changes what Debian hosts get.

Regenerate only for a change meant to reach Debian hosts:
    .venv/bin/python -m tests.stages.test_os_debian_golden > tests/fixtures/os-debian-golden.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers.planned_steps import harness, run

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "os-debian-golden.json"
DISTROS = {"ubuntu2204": ("ubuntu", "22.04"), "ubuntu2404": ("ubuntu", "24.04"), "debian12": ("debian", "12")}
STATE_MARK = "@@modelfleet-state"


def _urls(host: dict, system: str, arch: str) -> list:
    from modelfleet.fleet.urls import outside_urls
    from modelfleet.plan.inventory import resolve

    data = {k: v for k, v in host.items() if k != "fake_responses"}
    result = resolve([("n1", data)])
    return outside_urls(result, ["n1"], only_os=(system,), arches=(arch,))


def render() -> dict:
    from modelfleet.host import host_record
    from tests.stages.test_gpu_driver import bare, converged_state, loaded_probe, os_lines
    from tests.stages.test_secure_boot_stack import secure_host

    fake = harness()
    from modelfleet.host.os import debian

    # What a package operation runs when dpkg was interrupted (its FunctionCommand's second command).
    out: dict = {"host_record": host_record.script(), "dpkg repair": debian.DPKG_REPAIR_SH}
    for distro, (os_id, version) in DISTROS.items():
        for arch in ("x86_64", "aarch64"):
            cases = {
                "nvidia": bare(fake, "nvidia", distro),
                "nvidia_toolkit_distro_docker": bare(fake, "nvidia", distro, cuda_toolkit="13-0",
                                                     docker_source="distro"),
                "nvidia_no_pinning": bare(fake, "nvidia", distro, driver_pinning=False),
            }
            if arch == "x86_64":
                cases["amd"] = bare(fake, "amd", distro)
            for case, host in cases.items():
                if arch != "x86_64":
                    host["fake_responses"]["@@modelfleet-probe"] = fake.probe_reply(
                        {"os": os_lines(fake, distro, arch), "disk": [
                            "Filesystem 1-blocks Used Available Capacity Mounted on",
                            "/dev/md0 30000000000000 1000000000 29000000000000 1% /srv"], "ports": []})
                steps, asked = run(fake, host)
                out[f"{distro} {arch} {case}"] = {"steps": steps, "state": asked,
                                                  "urls": _urls(host, f"{os_id}-{version}", arch)}
    # A converged host moved to another release (versions asked for, Fabric Manager at it, holds moved).
    host = {"hardware": "h200", "gpu_count": 8, "model": "kimi-k2-thinking", "engine": "vllm", "pool": "p",
            "revision": "e" * 40, "driver_version": "580.95.05",
            "fake_responses": {"@@modelfleet-probe": loaded_probe(fake), STATE_MARK: converged_state()}}
    steps, asked = run(fake, host)
    out["ubuntu2404 x86_64 new driver_version on a converged host"] = {"steps": steps, "state": asked}
    # Secure Boot on Ubuntu: the archive is asked for Canonical's signed modules first.
    steps, asked = run(fake, secure_host(fake))
    out["ubuntu2404 x86_64 secure boot"] = {"steps": steps, "state": asked}
    return out


def _reboot_pending(fake, tmp_path, monkeypatch) -> dict:
    """The GPU stack's report on a converged host whose OS asks for a reboot (Debian: /run/reboot-required)."""
    from tests.stages.test_gpu_driver import converged_state, loaded_probe

    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    host = {"hardware": "h200", "gpu_count": 8, "model": "kimi-k2-thinking", "engine": "vllm", "pool": "p",
            "revision": "e" * 40, "driver_pinning": False,
            "fake_responses": {"@@modelfleet-probe": loaded_probe(fake), STATE_MARK: converged_state()}}
    run(fake, host, dry=False)
    return json.loads(next((tmp_path / "gpu_stack").glob("*.json")).read_text())


@pytest.fixture
def golden() -> dict:
    return json.loads(GOLDEN.read_text())


def test_debian_hosts_get_what_they_got_before_the_seam_was_reworded(golden, tmp_path, monkeypatch):
    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    now = render()
    assert sorted(now) == sorted(golden)
    for case in golden:
        assert now[case] == golden[case], case


def test_a_pending_kernel_update_is_read_from_debians_reboot_file(fake, tmp_path, monkeypatch):
    assert _reboot_pending(fake, tmp_path, monkeypatch)["kernel_update_pending"] is True


if __name__ == "__main__":
    import os
    import tempfile

    os.environ["MODELFLEET_REPORTS"] = tempfile.mkdtemp()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    json.dump(render(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
