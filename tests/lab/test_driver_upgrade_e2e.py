"""A rolling driver upgrade (#17) on two bare lab H200 hosts: built at 580.95.05 and serving, then rolled to
580.159.04 by `modelfleet upgrade`, one host at a time (drain, install, reboot, gate, restart)."""

import pytest

import lab
from lab.lab_driver_upgrade import NEW, OLD, rehearse

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def rolled(lab_hosts):
    personas = [s["persona"] for s in lab_hosts] + ["h200x1-bare", "h200x1-bare"]
    specs = lab.up(len(personas), personas=personas, disks=1)[-2:]
    yield rehearse(specs), specs
    lab.remove([s["name"] for s in specs])


def test_each_host_moves_to_the_new_driver_with_one_reboot_while_the_other_serves(rolled):
    summary, specs = rolled
    names = [s["name"] for s in specs]
    assert summary["exit"] == 0, summary
    assert [b["hosts"] for b in summary["batches"]] == [[names[0]], [names[1]]]
    assert all(b["driver_upgrade"] and b["result"] == "upgraded" for b in summary["batches"])
    assert summary["drivers"] == {n: {"before": OLD, "after": NEW} for n in names}
    assert sorted(summary["rebooted"]) == sorted(names) and summary["reboots"] == 2
    assert summary["failed_requests_outside_batch"] == 0 and summary["requests"] > 0
    for spec in specs:  # serving again, on the new release, units enabled for the next boot
        assert lab.ssh(spec, "cat /usr/lib/modelfleet-lab/nvidia-driver-version").stdout.strip() == NEW
        assert lab.ssh(spec, f"systemctl is-enabled modelfleet-tiny-{spec['name']}.service").stdout.strip() == "enabled"
