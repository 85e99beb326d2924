"""The Debian family (modelfleet.host.os.debian): what it tells a host, run where it can be (the real dpkg-query of
this machine, sh with stand-ins for apt-get), and the source files and paths the stages had before the seam,
byte for byte. Its operations have pyinfra-testing cases in tests/operations/os.debian.*."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from modelfleet.host.facts.state import DeployedState
from modelfleet.host.os import debian

needs_dpkg = pytest.mark.skipif(not shutil.which("dpkg-query"), reason="no dpkg-query here")


def sh(snippet: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": f"{path}:/usr/bin:/bin" if path else "/usr/bin:/bin"}
    return subprocess.run(["sh", "-c", snippet], env=env, capture_output=True, text=True, check=False)


def stand_in(tmp_path: Path, tool: str, script: str) -> None:
    stub = tmp_path / tool
    stub.write_text(f"#!/bin/sh\n{script}\n")
    stub.chmod(0o755)


@needs_dpkg
def test_deployed_state_reads_installed_packages_through_the_family_query():
    """The fact's whole program, run for real against this machine's dpkg database: an installed package with
    dpkg's own version, an absent one as absent."""
    truth = sh("dpkg-query -W -f='${Version}' dpkg").stdout
    assert truth, "dpkg-query knows no dpkg here"
    fact = DeployedState()
    ran = sh(fact.command(packages=("dpkg", "modelfleet-no-such-package"), family="debian"))
    assert ran.returncode == 0, ran.stderr
    found = fact.process(ran.stdout.splitlines())["packages"]
    assert found == {"dpkg": {"version": truth, "held": False}, "modelfleet-no-such-package": None}


def test_a_held_package_reads_as_held(tmp_path):
    """`hi` is what dpkg-query prints for a package on hold (apt-mark hold); a removed one with its config
    left (`rc`) is not installed."""
    stand_in(tmp_path, "dpkg-query", 'case "$4" in docker-ce) echo "hi  5:28.0.1-1~ubuntu.24.04~noble";; '
                                     'old) echo "rc  1.0-1";; esac')
    fact = DeployedState()
    ran = sh(fact.command(packages=("docker-ce", "old")), path=str(tmp_path))
    found = fact.process(ran.stdout.splitlines())["packages"]
    assert found == {"docker-ce": {"version": "5:28.0.1-1~ubuntu.24.04~noble", "held": True}, "old": None}


@pytest.mark.parametrize("version,upstream", [("1:580.159.04-1ubuntu1", "580.159.04"),
                                              ("580.95.05-0ubuntu1", "580.95.05"), ("2.28.1", "2.28.1")])
def test_upstream_version_reads_the_same_in_shell_and_python(tmp_path, version, upstream):
    assert debian.upstream(version) == upstream
    stand_in(tmp_path, "dpkg-query", f"printf %s '{version}'")
    assert sh(debian.upstream_sh("nvidia-driver-580-open"), path=str(tmp_path)).stdout.strip() == upstream


def test_exact_install_asks_apt_for_the_driver_packages_version(tmp_path):
    """Fabric Manager at the installed driver's version: apt-get gets `name="VERSION-*"` for each, allowed to
    move a held package; with no driver installed, apt-get is not run at all."""
    stand_in(tmp_path, "dpkg-query", "printf %s 1:580.95.05-0ubuntu1")
    stand_in(tmp_path, "env", 'shift; echo "$@" > "$(dirname "$0")/apt.args"')
    script = debian.exact_install_sh(["nvidia-fabricmanager-580", "nvidia-imex-580"], "nvidia-driver-580-open")
    assert sh(script, path=str(tmp_path)).returncode == 0
    args = (tmp_path / "apt.args").read_text().split()
    assert args[0] == "apt-get" and "--allow-change-held-packages" in args
    assert args[-2:] == ["nvidia-fabricmanager-580=580.95.05-*", "nvidia-imex-580=580.95.05-*"]
    (tmp_path / "apt.args").unlink()
    stand_in(tmp_path, "dpkg-query", "exit 1")
    assert sh(script, path=str(tmp_path)).returncode != 0
    assert not (tmp_path / "apt.args").exists()


def test_repositories_are_the_files_the_stages_wrote_before_the_seam():
    cuda = debian.cuda_repository("https://developer.download.nvidia.com/compute/cuda/repos/", "ubuntu2404", "sbsa")
    base = "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/sbsa/"
    assert (cuda.repo, cuda.package, cuda.package_url, cuda.keyring) == (
        "cuda", "cuda-keyring", base + "cuda-keyring_1.1-1_all.deb", "/usr/share/keyrings/cuda-archive-keyring.gpg")
    assert cuda.sources == [("/etc/apt/sources.list.d/cuda-ubuntu2404-sbsa.list",
                             f"deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] {base} /\n")]
    amd = debian.amd_repository("https://repo.radeon.com/", "7.0", "noble", "7.0.70000-1")
    assert amd.package_url == ("https://repo.radeon.com/amdgpu-install/7.0/ubuntu/noble/"
                               "amdgpu-install_7.0.70000-1_all.deb")
    signed = "[arch=amd64 signed-by=/etc/apt/keyrings/rocm.gpg]"
    assert amd.sources == [
        ("/etc/apt/sources.list.d/amdgpu.list", f"deb {signed} https://repo.radeon.com/amdgpu/7.0/ubuntu noble main\n"),
        ("/etc/apt/sources.list.d/rocm.list", f"deb {signed} https://repo.radeon.com/rocm/apt/7.0 noble main\n")]
    assert (amd.repo, amd.keyring) == ("rocm", "/etc/apt/keyrings/rocm.gpg")


def test_a_repository_is_laid_out_as_the_data_says_and_reads_back_as_apt_reads_it():
    docker = debian.repository("docker", "https://download.docker.com/linux/",
                               {"id": "ubuntu", "codename": "noble", "arch": "aarch64"})
    [(path, line)] = docker.sources
    assert path == "/etc/apt/sources.list.d/docker.list"
    assert line == ("deb [arch=arm64 signed-by=/etc/apt/keyrings/docker.asc] "
                    "https://download.docker.com/linux/ubuntu noble stable\n")
    assert (docker.repo, docker.key, docker.key_url) == (
        "docker", "/etc/apt/keyrings/docker.asc", "https://download.docker.com/linux/ubuntu/gpg")
    assert debian.source_urls(line, "aarch64") == [("https://download.docker.com/linux/ubuntu", "suite noble")]
    toolkit = debian.repository("nvidia-container-toolkit", "https://nvidia.github.io/libnvidia-container/stable/deb",
                                {"id": "debian"}, key_url="https://nvidia.github.io/libnvidia-container/gpgkey")
    [(_, flat)] = toolkit.sources
    assert flat == ("deb [signed-by=/etc/apt/keyrings/nvidia-container-toolkit.asc] "
                    "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n")
    assert toolkit.key_url == "https://nvidia.github.io/libnvidia-container/gpgkey"
    # apt's $(ARCH) is dpkg's name for the host's `uname -m`
    assert debian.source_urls(flat, "x86_64") == [("https://nvidia.github.io/libnvidia-container/stable/deb/amd64",
                                                   "suite /")]


def test_a_reboot_is_needed_when_debians_file_is_there():
    assert debian.reboot_asks() == {"paths": ["/run/reboot-required"]} and debian.REBOOT_SH is None
    assert debian.reboot_needed({"paths": {"/run/reboot-required": {"kind": "file"}}})
    assert not debian.reboot_needed({"paths": {"/run/reboot-required": None}})


def test_names_and_arches_come_from_the_data():
    assert debian.names("kernel_headers").format(kernel="6.8.0-87-generic") == "linux-headers-6.8.0-87-generic"
    assert debian.names("distro_docker") == "docker.io"
    assert set(debian.names("docker_holds")) <= set(debian.names("docker"))
    assert (debian.arch("x86_64"), debian.arch("aarch64"), debian.arch(None)) == ("amd64", "arm64", "amd64")


def test_unattended_upgrades_leave_every_excluded_pattern_alone():
    conf = debian.upgrades_conf()
    assert conf.startswith("// Managed by modelfleet")
    for pattern in ("nvidia-", "libnvidia-", "linux-modules-nvidia-", "cuda-", "docker-ce", "containerd.io", "rocm"):
        assert f'    "{pattern}";\n' in conf
    assert debian.upgrades_config() == (debian.UPGRADES_CONF, conf)
    assert debian.UPGRADES_CONF.startswith("/etc/apt/apt.conf.d/")


class _Host:
    """A host whose dpkg was interrupted (`interrupted`) and whose repair succeeds or not (`repairs`)."""

    def __init__(self, interrupted: bool, repairs: bool):
        self.interrupted, self.repairs, self.ran, self.logged = interrupted, repairs, [], []
        self.name = "gpu-7"

    def run_shell_command(self, command, **kwargs):
        text = str(command)
        self.ran.append(text)
        output = type("Output", (), {"stderr_lines": ["E: Sub-process /usr/bin/dpkg returned an error code (1)"]})
        if "dpkg --configure -a" in text:
            return self.repairs, output
        return self.interrupted, output

    def log_styled(self, message, **kwargs):
        self.logged.append(message)


def test_an_interrupted_package_install_is_finished_first_and_named(monkeypatch):
    refused = []
    monkeypatch.setattr(debian, "refuse", lambda state, host, reasons: refused.extend(reasons) or False)
    clean = _Host(interrupted=False, repairs=True)
    assert debian._interrupted_repaired(None, clean) and len(clean.ran) == 1 and not clean.logged
    broken = _Host(interrupted=True, repairs=True)
    assert debian._interrupted_repaired(None, broken)
    assert "dpkg --configure -a" in broken.ran[1] and "apt-get -y -q -f install" in broken.ran[1]
    assert broken.logged == ["an interrupted package install (dpkg) was found: finishing it first "
                             "(dpkg --configure -a, apt-get -f install)"]
    stuck = _Host(interrupted=True, repairs=False)
    assert not debian._interrupted_repaired(None, stuck)
    assert refused and "could not be finished" in refused[0] and "dpkg returned an error code" in refused[0]


def test_the_interrupted_check_reads_dpkgs_journal(tmp_path):
    updates = tmp_path / "updates"
    updates.mkdir()
    check = debian.DPKG_INTERRUPTED_SH.replace("/var/lib/dpkg/updates", str(updates)).replace(
        "dpkg --audit", "true")  # the journal alone
    assert sh(check).returncode == 1
    (updates / "0000").write_text("")
    assert sh(check).returncode == 0
