"""Power lost during the driver's dpkg, on a bare lab H200: the driver package left unpacked and unconfigured and
dpkg's journal not replayed, as a host that lost power mid-install comes back. apt refuses every install until
`dpkg --configure -a` ran; the next plain run finishes the interrupted install first, says so in one line and
converges."""

import time

import pytest

import lab
from lab import REPO_ROOT
from modelfleet.base.commands import run_pyinfra

pytestmark = pytest.mark.lab
DRIVER = "nvidia-driver-580-open"


@pytest.fixture(scope="module")
def bare(lab_hosts):
    personas = [s["persona"] for s in lab_hosts] + ["h200x1-bare"]
    spec = lab.up(len(personas), personas=personas, disks=1)[-1]
    yield spec
    lab.remove([spec["name"]])


def stack_run(spec):
    with lab.scenario.applied(only=[spec["name"]]):
        return run_pyinfra("inventories/lab.py", "deploys/gpu_stack.py", extra=["--data", "reboot=false"],
                           cwd=REPO_ROOT, timeout=900)


def test_an_install_interrupted_by_power_loss_is_finished_first_by_the_next_plain_run(bare):
    first = stack_run(bare)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    # What the power cut leaves: the driver's new files unpacked, not configured, dpkg's journal not replayed.
    cut = lab.ssh(bare, f"cd /tmp && apt-get download -q {DRIVER} && dpkg --remove --force-depends {DRIVER} && "
                        f"dpkg --unpack /tmp/{DRIVER}_*.deb && touch /var/lib/dpkg/updates/0001 && "
                        f"dpkg-query -W -f='${{db:Status-Abbrev}}' {DRIVER}")
    assert cut.returncode == 0 and cut.stdout.split()[-1] == "iU", cut.stdout + cut.stderr
    refused = lab.ssh(bare, "apt-get -y install jq 2>&1")
    assert refused.returncode != 0 and "dpkg was interrupted" in refused.stdout, refused.stdout
    started = time.monotonic()
    again = stack_run(bare)
    out = again.stdout + again.stderr
    named = [line for line in out.splitlines() if "interrupted package install (dpkg)" in line]
    assert again.returncode == 0 and len(named) == 1 and bare["name"] in named[0], out[-3000:]
    print(f"\ninterrupted dpkg: repaired and named, the run converged {time.monotonic() - started:.1f} s after it "
          "started")
    state = lab.ssh(bare, f"dpkg-query -W -f='${{db:Status-Abbrev}}' {DRIVER}; ls -A /var/lib/dpkg/updates; "
                          "dpkg --audit")
    assert state.stdout.split() == ["hi"], state.stdout  # installed (and held, as the run holds it); no journal
    third = stack_run(bare)
    assert third.returncode == 0 and "interrupted package install" not in third.stdout + third.stderr
