"""One lab for the whole lab test session: three hosts (vllm, sglang, llama.cpp doubles), registry, signed apt
repository and hub double. It is the suite's own lab (tests/conftest.py), beside any lab a user started; its
teardown checks that `lab down` leaves nothing of it behind."""

import shutil
import subprocess

import pytest

import lab
from lab import scenario as lab_scenario


def dockerd_answers() -> bool:
    return bool(shutil.which("docker")) and subprocess.run(["docker", "info"], capture_output=True).returncode == 0


@pytest.fixture(scope="session")
def lab_hosts():
    if not dockerd_answers():
        pytest.skip("the lab needs a running dockerd (see .ci/run)")
    assert lab.NET, "the lab tests run on their own lab (tests/conftest.py), never on a user's"
    lab.down()  # leftovers of an interrupted test session, never a user's lab
    specs = lab.up(3, disks=1)  # one loop device per host, standing in for an NVMe drive
    yield specs
    pids = [p.read_text() for p in lab.STATE.glob("*.pid")]
    lab.down()
    left = subprocess.run(["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True).stdout
    assert not [n for n in left.split() if n.startswith(lab.PREFIX) or lab.PREFIX in n], left
    table = subprocess.run(["ps", "-eo", "pgid=,stat=,args="], capture_output=True, text=True).stdout.splitlines()
    alive = [row for row in table if row.split()[0] in pids and not row.split()[1].startswith("Z")]
    assert not alive, f"lab down left processes behind: {alive}"
    agents = subprocess.run(["pgrep", "-f", f"gpg-agent.*{lab.STATE}"], capture_output=True, text=True).stdout
    assert not agents.strip(), agents
    mounts = open("/proc/mounts").read()
    assert str(lab.STATE / "hosts") not in mounts
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    assert str(lab.STATE) not in loops, loops


@pytest.fixture(scope="module")
def pair_host(lab_hosts):
    """An 8x B300 (pre-built persona) joins the session's lab for a module, to serve two pools side by side
    (the scenario's two_pools)."""
    personas = [s["persona"] for s in lab_hosts] + ["b300x8-synthetic"]
    spec = lab.up(len(personas), personas=personas, disks=1)[-1]
    yield spec
    lab.remove([spec["name"]])


@pytest.fixture(autouse=True)
def scenario():
    """scenario(**fields): the lab's scenario (lab/scenario.py) for the runs that follow in the test; every test
    starts on the defaults and leaves none behind, whether it wrote one through this or lab.scenario."""
    lab_scenario.clear()
    yield lab_scenario.write
    lab_scenario.clear()
