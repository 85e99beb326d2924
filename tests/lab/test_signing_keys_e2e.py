"""A repository taken over: the lab's apt stand-in re-signed with another key, which it also serves as every
signing key and puts in its cuda-keyring package. A bare host pinned to the lab's own key (as the lab inventory
pins it, from `lab up`) refuses the keyring package before installing it, and Docker's key before apt may trust
it: nothing is installed from the repositories, no key is left in place, and the run names the repository,
the key expected and the key found."""

import json
import subprocess

import pytest

import lab
from modelfleet import REPO_ROOT
from modelfleet.base.commands import run_pyinfra

pytestmark = pytest.mark.lab

FROM_REPOS = ("cuda-keyring", "nvidia-driver-pinning-580", "nvidia-driver-580-open", "docker-ce",
              "nvidia-container-toolkit")


@pytest.fixture(scope="module")
def taken_over(lab_hosts, tmp_path_factory):
    personas = [s["persona"] for s in lab_hosts] + ["h200x1-bare"]
    bare = lab.up(len(personas), personas=personas, disks=1)[-1]
    ours = lab.apt.fingerprint(lab.STATE / "gnupg")
    attacker = tmp_path_factory.mktemp("attacker-gnupg")
    lab.apt.build(lab.STATE, lab.LAB_DIR, signer=attacker)
    try:
        yield bare, ours, lab.apt.fingerprint(attacker)
    finally:
        lab.apt.build(lab.STATE, lab.LAB_DIR)  # the lab's own repositories again, for the tests after these
        subprocess.run(["gpgconf", "--homedir", str(attacker), "--kill", "gpg-agent"], capture_output=True)
        lab.remove([bare["name"]])


def installed(spec) -> str:
    return lab.ssh(spec, "dpkg-query -W -f='${Package} ${db:Status-Abbrev}\\n' " + " ".join(FROM_REPOS) +
                   " 2>/dev/null | grep ' ii' || true").stdout


def gpu_stack(spec, *data: str):
    extra = [x for pair in data for x in ("--data", pair)]
    with lab.scenario.applied(only=[spec["name"]]):
        return run_pyinfra("inventories/lab.py", "deploys/gpu_stack.py", cwd=REPO_ROOT, timeout=600,
                           extra=["--data", "reboot=false", *extra])


def test_keyring_package_with_another_key_is_never_installed(taken_over):
    spec, ours, theirs = taken_over
    run = gpu_stack(spec)
    out = run.stdout + run.stderr
    assert run.returncode != 0, out[-3000:]
    assert "the signing key of cuda" in out and f"expected {ours}" in out and f"found {theirs}" in out, out[-3000:]
    assert installed(spec) == ""
    left = lab.ssh(spec, "ls /usr/share/keyrings/cuda-archive-keyring.gpg /etc/apt/sources.list.d/cuda* "
                         "/tmp/modelfleet-cuda-keyring.deb* 2>&1; true").stdout
    assert left.count("No such file") == 3, left


def test_downloaded_key_not_pinned_is_never_put_in_place(taken_over):
    """The operator pins the new CUDA key (the driver goes on), Docker's stays the lab's: Docker's key is
    refused after download, so nothing of Docker's repository is installed."""
    spec, ours, theirs = taken_over
    pins = {"cuda": [theirs], "docker": [ours], "nvidia-container-toolkit": [ours], "rocm": [ours]}
    run = gpu_stack(spec, f"repo_key_fingerprints={json.dumps(pins)}")
    out = run.stdout + run.stderr
    assert run.returncode != 0, out[-3000:]
    assert "the signing key of docker" in out and f"expected {ours}" in out and f"found {theirs}" in out, out[-3000:]
    got = installed(spec)
    assert "cuda-keyring" in got and "docker-ce" not in got and "nvidia-container-toolkit" not in got, got
    left = lab.ssh(spec, "ls /etc/apt/keyrings/docker.asc /etc/apt/keyrings/docker.asc.tmp 2>&1; true").stdout
    assert left.count("No such file") == 2, left
