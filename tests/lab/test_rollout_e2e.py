"""`modelfleet upgrade` on the lab: all hosts on vLLM doubles; a good image rolls out host by host with no
failed request outside the host being switched; an image whose engine never gets ready fails the gate on the
first host, which is put back on its previous digest and revision, and the rollout stops."""

import json

import pytest

import lab
from lab import ssh
from modelfleet.base.commands import run_modelfleet, run_pyinfra

pytestmark = pytest.mark.lab
def run(*argv, **fields):
    """A modelfleet command on the lab with vLLM on every host (and the scenario's other `fields`)."""
    lab.scenario.write(engine="vllm", **fields)
    return run_modelfleet(*argv, timeout=1200)


def image_of(spec):
    return ssh(spec, f"docker inspect --format '{{{{.Config.Image}}}}' "
                     f"modelfleet-tiny-{spec['name']}-{spec['name']}").stdout.strip()


def test_upgrade_then_a_broken_image_is_rolled_back(lab_hosts):
    lab.scenario.write(engine="vllm")
    first = run_pyinfra("inventories/lab.py", "deploys/serve.py", timeout=1200)
    assert first.returncode == 0, first.stdout[-3000:]
    before = {s["name"]: image_of(s) for s in lab_hosts}
    good = run("upgrade", "inventories/lab.py", "-y", "--min-healthy", "2",
               image=lab.UPGRADE_IMAGE)
    report = json.loads(good.stdout)
    assert good.returncode == 0, report
    assert report["upgraded"] == [s["name"] for s in lab_hosts] and report["failures_outside_batch"] == 0
    upgraded = {s["name"]: image_of(s) for s in lab_hosts}
    assert all(":v0.35.0@sha256:" in image for image in upgraded.values()) and upgraded != before
    shown = json.loads(run("status", "inventories/lab.py", "--json").stdout)
    assert {row["host"]: row["services"][0]["image"] for row in shown} == upgraded  # status shows the new digest
    # At least 2 of 3 endpoints answered throughout: failures only ever hit the host being switched.
    assert set(report["endpoint_failures"]) <= set(report["upgraded"]) and report["failures_outside_batch"] == 0

    bad = run("upgrade", "inventories/lab.py", "-y", "--min-healthy", "2",
              image=lab.BROKEN_IMAGE)
    report = json.loads(bad.stdout)
    first_host = lab_hosts[0]["name"]
    assert bad.returncode == 1 and report["upgraded"] == []
    assert [r["host"] for r in report["rolled_back"]] == [first_host] and report["rolled_back"][0]["ok"]
    assert "gate failed" in report["stopped"] and report["failures_outside_batch"] == 0
    assert image_of(lab_hosts[0]) == upgraded[first_host]  # back on the digest it ran before
    assert ssh(lab_hosts[0], f"systemctl is-active modelfleet-tiny-{first_host}.service").stdout.strip() == "active"
    assert {image_of(s) for s in lab_hosts[1:]} == {upgraded[s["name"]] for s in lab_hosts[1:]}  # untouched
