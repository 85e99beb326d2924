"""`modelfleet upgrade --dry` on the lab: the hosts served, the inventory then names another image; the dry run
reads what each host runs (its pinned digest and revision, over SSH) and prints it beside what the inventory
says, batch by batch, and changes nothing."""

import json

import pytest

import lab
from lab import ssh
from modelfleet.base.commands import run_modelfleet, run_pyinfra

pytestmark = pytest.mark.lab


def image_of(spec):
    return ssh(spec, f"docker inspect --format '{{{{.Config.Image}}}}' "
                     f"modelfleet-tiny-{spec['name']}-{spec['name']}").stdout.strip()


def test_dry_shows_each_hosts_image_and_revision_old_to_new(lab_hosts):
    lab.scenario.write(engine="vllm")
    served = run_pyinfra("inventories/lab.py", "deploys/serve.py", timeout=1200)
    assert served.returncode == 0, served.stdout[-3000:]
    before = {s["name"]: image_of(s) for s in lab_hosts}
    lab.scenario.write(engine="vllm", image=lab.UPGRADE_IMAGE)
    dry = run_modelfleet("upgrade", "--dry", "inventories/lab.py", "--parallel", "2", timeout=300)
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]
    batches = json.loads(dry.stdout)["batches"]
    assert [len(b["hosts"]) for b in batches] == [2, 1]
    for batch in batches:
        for host in batch["hosts"]:
            change = batch["changes"][host]
            assert change["reachable"], change
            [svc] = change["services"]
            assert svc["image"]["old"] == before[host] and "@sha256:" in before[host]
            assert svc["image"]["new"].endswith(lab.UPGRADE_IMAGE) and svc["image"]["changes"] is True
            assert svc["revision"]["old"] and svc["revision"]["new"]
        assert batch["drain"]["summary"] == "none: no front door, no driver change"
    assert {s["name"]: image_of(s) for s in lab_hosts} == before  # nothing changed
