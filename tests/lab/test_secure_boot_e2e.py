"""Secure Boot on the lab (lab/secure_boot.py): two bare H200 hosts presenting as Ubuntu 24.04 with UEFI Secure
Boot on and DKMS's key not enrolled. The one on kernel 6.8.0-87-generic gets Canonical's signed modules from the
archive (no DKMS driver, no kernel headers, held), one reboot, and its GPUs answer; the one on 6.8.0-90-generic,
for which the archive has no signed module, is refused before anything is installed, naming the MOK step."""

import json
import subprocess

import pytest

import lab
from lab import secure_boot
from lab.rebuild import pyinfra, rehearse
from modelfleet.base.commands import modelfleet_argv

pytestmark = pytest.mark.lab
SIGNED = ["linux-modules-nvidia-580-server-open-6.8.0-87-generic", "linux-modules-nvidia-580-server-open-generic",
          "nvidia-headless-no-dkms-580-server-open", "nvidia-utils-580-server"]


@pytest.fixture(scope="module")
def secure(lab_hosts, tmp_path_factory):
    personas = [s["persona"] for s in lab_hosts] + list(secure_boot.KERNELS)
    specs = lab.up(len(personas), personas=personas, disks=1)
    yield {"signed": specs[-2], "newer": specs[-1], "reports": tmp_path_factory.mktemp("reports")}
    lab.remove([s["name"] for s in specs[-2:]])


def installed(spec) -> list[str]:
    return lab.ssh(spec, "dpkg-query -W -f '${Package} ${Version}\\n'; apt-mark showhold; "
                         "ls /etc/apt/sources.list.d").stdout.splitlines()


def test_a_kernel_without_signed_modules_is_refused_before_anything_is_installed(secure):
    spec = secure["newer"]
    before = installed(spec)
    run = pyinfra([spec["name"]], "gpu_stack.py", secure["reports"] / "newer")
    text = run.stdout + run.stderr
    assert run.returncode != 0 and "Traceback" not in text, text[-3000:]
    [line] = [x for x in text.splitlines() if spec["name"] in x and "refused: secure boot:" in x]
    assert "no linux-modules-nvidia-580-server-open-6.8.0-90-generic" in line
    assert "mokutil --import /var/lib/shim-signed/mok/MOK.der" in line and "nothing was installed" in line
    assert installed(spec) == before  # no package, no hold, no source list


def test_the_signed_modules_are_installed_held_and_load_after_one_reboot(secure):
    spec = secure["signed"]
    [row] = rehearse([spec], skewed=None, reports=secure["reports"] / "signed")
    assert row["first_run_ok"] and row["reboots_taken"] == 1, row
    assert set(SIGNED) <= set(row["packages_installed"]), row["packages_installed"]
    assert not [p for p in row["packages_installed"] if p.startswith(("nvidia-driver-", "linux-headers-",
                                                                          "cuda-keyring"))]
    assert row["second_run"]["ok"] and row["second_run"]["changed_operations_all_hosts"] == 0, row["second_run"]
    assert row["preflight_after"]["ok"] and row["answers_after"]["driver"] == "580.159.04", row
    assert set(SIGNED) <= set(row["answers_after"]["held"])
    report = json.loads((secure["reports"] / "signed" / "gpu_stack" / f"{spec['name']}.json").read_text())
    assert report["driver_source"] == "ubuntu-signed" and report["secure_boot"] == "enabled"
    assert lab.ssh(spec, "cat /usr/lib/modelfleet-lab/nvidia-module-signer").stdout.strip() == \
        "Canonical Ltd. Kernel Module Signing"


def test_status_json_carries_the_host_record(secure):
    spec = secure["signed"]
    with lab.scenario.applied(only=[spec["name"]]):
        run = subprocess.run(modelfleet_argv("status", "inventories/lab.py", "--json"), capture_output=True,
                             text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    [row] = [r for r in json.loads(run.stdout) if r["host"] == spec["name"]]
    record = row["record"]
    assert (record["os"], record["kernel"], record["kernel_flavour"], record["secure_boot"]) == (
        "Ubuntu 24.04.3 LTS", "6.8.0-87-generic", "generic", "enabled")
    assert record["driver"] == {"branch": "580", "version": "580.159.04", "source": "ubuntu-signed",
                                "module_signer": "Canonical Ltd. Kernel Module Signing"}
    assert record["vbios"] and record["fabric_manager"] is None  # one H200: no NVSwitch, no Fabric Manager
