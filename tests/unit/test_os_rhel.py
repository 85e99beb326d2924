"""The RHEL family (modelfleet.host.os.rhel): its shell run where it can be (sh here, with stand-ins for rpm, dnf and
needs-restarting that answer as the outputs recorded from public sources in tests/fixtures/os-rhel/ show; SOURCE
there names each), its repository files against the vendors' own, and a GPU stack planned for a Rocky host.
No RHEL host and no RPM registry can be reached here: these are the checks that can be made without one."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from modelfleet.host import os as osfam
from modelfleet.host.facts.state import DeployedState
from modelfleet.host.os import rhel
from modelfleet.plan import trust

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "os-rhel"
LOCKS = osfam.family_data("rhel")["versionlock"]


def recorded(name: str) -> str:
    return (FIXTURES / name).read_text()


def sh(snippet: str, path: Path | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": f"{path}:/usr/bin:/bin" if path else "/usr/bin:/bin"}
    return subprocess.run(["sh", "-c", snippet], env=env, capture_output=True, text=True, check=False)


def stand_in(folder: Path, tool: str, script: str) -> None:
    stub = folder / tool
    stub.write_text(f"#!/bin/sh\n{script}\n")
    stub.chmod(0o755)


def rpm_stand_in(folder: Path, installed: dict[str, tuple[str, str, str]]) -> None:
    """`rpm -q --qf FORMAT -- NAME` as rpm answers it: FORMAT with the package's EPOCH, VERSION and RELEASE
    (EPOCH "(none)" without one: rpm issue 2364), or rpm's recorded "not installed" line on stdout, exit 1."""
    cases = "".join(f"{name}) e='{e}'; v='{v}'; r='{r}';; " for name, (e, v, r) in installed.items())
    not_installed = recorded("rpm-q-not-installed.txt").strip().replace("kernel-source-nvidia390", "$5")
    stand_in(folder, "rpm", f'case "$5" in {cases}*) echo "{not_installed}"; exit 1;; esac\n'
                            'printf \'%b\' "$(printf \'%s\' "$3" | sed "s/%{EPOCH}/$e/; s/%{VERSION}/$v/; '
                            's/%{RELEASE}/$r/")"')


def state_of(snippet_locks: dict[str, Path], package: str, path: Path) -> str:
    """PACKAGE_STATE_SH for `package`, its lock files at `snippet_locks` (the host's paths, moved here)."""
    program = rhel.PACKAGE_STATE_SH.replace(LOCKS["list"], str(snippet_locks["list"])).replace(
        LOCKS["toml"], str(snippet_locks["toml"]))
    return sh(f"package_state() {{ {program}; }}; package_state {shlex.quote(package)}", path).stdout


# rpm's own answer for the rpm package (rpm issue 2364: %{evr} 4.18.0-1.fc37, %{epoch} (none)).
RPM = ("(none)", "4.18.0", "1.fc37")
# The installed versions the recorded locks were taken from (`versionlock add` locks the installed version).
TERRAFORM = ("0", "1.5.5", "1")  # versionlock-list.txt: terraform-0:1.5.5-1.*
BASH = ("0", "5.2.15", "5.fc39")  # versionlock.toml: bash at 0:5.2.15-5.fc39


def test_the_recorded_outputs_are_what_the_stand_ins_answer():
    text = recorded("rpm-q-qf-rpm.txt").splitlines()
    assert text[text.index("$ rpm -q --qf %{evr} rpm") + 1] == f"{RPM[1]}-{RPM[2]}"
    assert text[text.index("$ rpm -q --qf %{epoch} rpm") + 1] == RPM[0]
    assert "terraform-0:1.5.5-1.*" in recorded("versionlock-list.txt").splitlines()
    toml = recorded("versionlock.toml")
    assert 'name = "bash"' in toml and 'value = "0:5.2.15-5.fc39"' in toml


def test_package_state_reads_rpm_and_dnf4s_lock_list(tmp_path):
    rpm_stand_in(tmp_path, {"rpm": RPM, "terraform": TERRAFORM})
    (tmp_path / "versionlock.list").write_text(recorded("versionlock-list.txt"))
    locks = {"list": tmp_path / "versionlock.list", "toml": tmp_path / "absent.toml"}
    assert state_of(locks, "rpm", tmp_path) == "ii 4.18.0-1.fc37\n"  # "(none):" is no epoch
    assert state_of(locks, "terraform", tmp_path) == "hi 0:1.5.5-1\n"
    # rpm's "package ... is not installed" is on stdout: it is not read as a version.
    assert state_of(locks, "kernel-source-nvidia390", tmp_path) == ""


def test_package_state_reads_dnf5s_lock_file(tmp_path):
    rpm_stand_in(tmp_path, {"bash": BASH, "rpm": RPM})
    (tmp_path / "versionlock.toml").write_text(recorded("versionlock.toml"))
    locks = {"list": tmp_path / "absent.list", "toml": tmp_path / "versionlock.toml"}
    assert state_of(locks, "bash", tmp_path) == "hi 0:5.2.15-5.fc39\n"
    assert state_of(locks, "rpm", tmp_path) == "ii 4.18.0-1.fc37\n"


def test_a_lock_on_a_longer_name_does_not_hold_its_prefix(tmp_path):
    """Constructed lines in the recorded form: docker-ce-cli's lock is not docker-ce's."""
    rpm_stand_in(tmp_path, {"docker-ce": ("3", "28.0.1", "1.el9"), "docker-ce-cli": ("1", "28.0.1", "1.el9")})
    (tmp_path / "versionlock.list").write_text("docker-ce-cli-1:28.0.1-1.el9.*\n")
    locks = {"list": tmp_path / "versionlock.list", "toml": tmp_path / "absent.toml"}
    assert state_of(locks, "docker-ce", tmp_path) == "ii 3:28.0.1-1.el9\n"
    assert state_of(locks, "docker-ce-cli", tmp_path) == "hi 1:28.0.1-1.el9\n"


def test_deployed_state_reads_packages_and_the_reboot_question_through_the_family(tmp_path):
    """The fact's whole program with the RHEL family's functions: a package, an absent one, and the answer of
    needs-restarting -r (recorded output, exit 1: a reboot is needed)."""
    rpm_stand_in(tmp_path, {"rpm": RPM})
    stand_in(tmp_path, "needs-restarting", f"cat <<'EOF'\n{recorded('needs-restarting-reboot.txt')}EOF\nexit 1")
    fact = DeployedState()
    ran = sh(fact.command(packages=("rpm", "nvidia-open"), reboots=("host",), family="rhel"), tmp_path)
    assert ran.returncode == 0, ran.stderr
    found = fact.process(ran.stdout.splitlines())
    assert found["packages"] == {"rpm": {"version": "4.18.0-1.fc37", "held": False}, "nvidia-open": None}
    assert found["reboots"] == {"host": True} and rhel.reboot_needed(found)


@pytest.mark.parametrize("tool,output,status,needed", [
    ("needs-restarting", "needs-restarting-reboot.txt", 1, True),
    ("needs-restarting", "needs-restarting-no-reboot.txt", 0, False),
    # RHEL 10's dnf 5: `dnf needs-restarting`, the same exit statuses (its manual)
    ("dnf", "needs-restarting-reboot.txt", 1, True),
    ("dnf", "needs-restarting-no-reboot.txt", 0, False),
])
def test_the_reboot_question_is_needs_restartings_exit_status(tmp_path, tool, output, status, needed):
    stand_in(tmp_path, tool, f"cat <<'EOF'\n{recorded(output)}EOF\nexit {status}")
    assert (sh(rhel.REBOOT_SH, tmp_path).returncode == 0) is needed


def test_no_answer_is_no_reboot(tmp_path):
    """Neither tool there (dnf-utils not installed yet): the shell's 127 is not needs-restarting's 1."""
    assert sh(rhel.REBOOT_SH.replace("dnf -q", str(tmp_path / "no-dnf")), tmp_path).returncode == 1
    assert rhel.reboot_asks() == {"reboots": ["host"]} and not rhel.reboot_needed({"reboots": {}})


def _sections(text: str) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        if line.startswith("["):
            section = out.setdefault(line.strip("[]"), {})
        elif "=" in line:
            key, _, value = line.partition("=")
            section[key] = value
    return out


def test_cuda_repository_is_nvidias_repo_file_with_its_key_checked_here():
    repo = rhel.cuda_repository("https://developer.download.nvidia.com/compute/cuda/repos/", "rhel9", "x86_64",
                                580, "-open")
    (path, content), (module_path, module) = repo.sources
    ours, theirs = _sections(content), _sections(recorded("cuda-rhel9.repo"))
    assert path == "/etc/yum.repos.d/cuda-rhel9.repo" and list(ours) == list(theirs) == ["cuda-rhel9-x86_64"]
    key_url = theirs["cuda-rhel9-x86_64"].pop("gpgkey")
    assert ours["cuda-rhel9-x86_64"].pop("gpgkey") == f"file://{repo.key}"
    assert ours == theirs
    # NVIDIA's rpm key, fetched from where its .repo file names it and checked against its pin; rpm lists it
    # by the pinned fingerprint's last eight digits once imported.
    assert repo.key_url == key_url and repo.repo == "cuda-rpm"
    [listed] = recorded("rpm-qa-gpg-pubkey.txt").split()
    assert trust.signing_keys()["cuda-rpm"]["fingerprints"][0].lower().endswith(listed.split("-")[2])
    # RHEL 9 takes the branch from a module stream (NVIDIA: `dnf module enable nvidia-driver:580-open`)
    assert module_path == "/etc/dnf/modules.d/nvidia-driver.module" and "stream=580-open\n" in module
    ten = rhel.cuda_repository("https://developer.download.nvidia.com/compute/cuda/repos", "rhel10", "sbsa", 580)
    assert [p for p, _ in ten.sources] == ["/etc/yum.repos.d/cuda-rhel10.repo"]  # no streams on RHEL 10


def test_toolkit_repository_is_nvidias_rpm_repo_file_from_the_apt_default():
    repo = rhel.repository("nvidia-container-toolkit", "https://nvidia.github.io/libnvidia-container/stable/deb",
                           {"id": "rocky"}, key_url="https://nvidia.github.io/libnvidia-container/gpgkey")
    [(path, content)] = repo.sources
    ours = _sections(content)["nvidia-container-toolkit"]
    theirs = _sections(recorded("nvidia-container-toolkit.repo"))["nvidia-container-toolkit"]
    assert path == "/etc/yum.repos.d/nvidia-container-toolkit.repo"
    assert repo.key_url == theirs.pop("gpgkey") and ours.pop("gpgkey") == f"file://{repo.key}"
    assert ours == theirs


def test_docker_repository_is_dockers_rhel_repo():
    repo = rhel.repository("docker", "https://download.docker.com/linux", {"id": "almalinux", "version_id": "9.6"})
    [(path, content)] = repo.sources
    ours = _sections(content)["docker-ce-stable"]
    theirs = _sections(recorded("docker-ce.repo"))["docker-ce-stable"]  # the CentOS variant's
    assert path == "/etc/yum.repos.d/docker-ce.repo"
    same = ("name", "enabled", "gpgcheck")
    assert {k: ours[k] for k in same} == {k: theirs[k] for k in same}
    # The RHEL variant's URLs (socheatsok78/cloud-images, SOURCE): resolved for RHEL 9 on x86_64
    assert ours["baseurl"].replace("$releasever", "9").replace("$basearch", "x86_64") + "/" == \
        "https://download.docker.com/linux/rhel/9/x86_64/stable/"
    assert repo.key_url == "https://download.docker.com/linux/rhel/gpg" and repo.repo == "docker-rpm"


def test_amd_repositories_are_amds_el_repo_files():
    repo = rhel.amd_repository("https://repo.radeon.com/", "7.0.1", "9.6", "unused")
    files = dict(repo.sources)
    ours = _sections(files["/etc/yum.repos.d/rocm.repo"])["rocm"]
    theirs = _sections(recorded("rocm.repo"))["rocm"]
    assert repo.key_url == theirs.pop("gpgkey") and ours.pop("gpgkey") == f"file://{repo.key}"
    assert {k: ours[k] for k in ("baseurl", "enabled", "priority", "gpgcheck")} == \
        {k: theirs[k] for k in ("baseurl", "enabled", "priority", "gpgcheck")}
    amdgpu = _sections(files["/etc/yum.repos.d/amdgpu.repo"])["amdgpu"]
    assert amdgpu["baseurl"] == "https://repo.radeon.com/amdgpu/7.0.1/el/9.6/main/x86_64/"


def test_a_repo_file_reads_back_for_the_urls_view():
    repo = rhel.repository("nvidia-container-toolkit", "https://nvidia.github.io/libnvidia-container/stable/deb",
                           None)
    assert rhel.source_urls(repo.sources[0][1], "aarch64") == [
        ("https://nvidia.github.io/libnvidia-container/stable/rpm/aarch64", "repository nvidia-container-toolkit")]


def test_versions_read_as_rpm_prints_them(tmp_path):
    epoch_version = recorded("dnf-check-upgrade-nvidia.txt").split()[1]
    assert rhel.upstream(epoch_version) == "580.126.09"
    assert rhel.upstream("4.18.0-1.fc37") == "4.18.0"
    rpm_stand_in(tmp_path, {"nvidia-open": ("3", "580.126.09", "1.el9")})
    assert sh(rhel.upstream_sh("nvidia-open"), tmp_path).stdout == "580.126.09\n"
    assert sh(rhel.upstream_sh("nvidia-imex-580"), tmp_path).stdout == ""  # not installed: nothing
    assert rhel.missing({"nvidia-open": "580.126.09", "curl": None}, {"nvidia-open": {"version": epoch_version}}) \
        == {"curl": None}


def test_exact_install_waits_for_the_drivers_version_and_keeps_the_locks(tmp_path):
    """Fabric Manager at the installed driver's version: nothing runs when the driver is not installed."""
    rpm_stand_in(tmp_path, {})
    stand_in(tmp_path, "dnf", f'echo "$@" >> {tmp_path}/dnf.args')
    script = rhel.exact_install_sh(["nvidia-fabricmanager-580"], "nvidia-open")
    assert sh(script, tmp_path).returncode != 0 and not (tmp_path / "dnf.args").exists()
    rpm_stand_in(tmp_path, {"nvidia-open": ("3", "580.126.09", "1.el9")})
    assert sh(script, tmp_path).returncode == 0
    assert (tmp_path / "dnf.args").read_text().splitlines() == [
        "-y -q versionlock delete nvidia-fabricmanager-580",
        "-y -q install --allowerasing nvidia-fabricmanager-580-580.126.09*",
        "-y -q versionlock add nvidia-fabricmanager-580"]


def test_release_tables_and_names():
    assert osfam.family({"id": "rocky", "version_id": "9.6"}).NAME == "rhel"
    assert osfam.release({"id": "almalinux", "version_id": "10.0"})["cuda"] == "rhel10"
    assert ("rhel", "9.6") in osfam.releases("amdgpu") and ("rhel", "9.4") not in osfam.releases("amdgpu")
    # dnf 5 (RHEL 10) has versionlock built in: no plugin package to install there
    assert "python3-dnf-plugin-versionlock" in rhel.names("base", {"id": "rocky", "version_id": "9.6"})
    assert "python3-dnf-plugin-versionlock" not in rhel.names("base", {"id": "rocky", "version_id": "10.0"})
    assert "Rocky Linux 9.4, 9.6, 10.0" in osfam.supported("cuda")
