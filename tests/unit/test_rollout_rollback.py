"""A batch whose gate fails is put back: every service of each host on the image and revision it ran before.
pyinfra's `--data` reaches every host alike, so the rollback says one image and revision at host level; a host
whose services ran different ones (the old rollback put them all on the first one's) is refused by name and not
run. What the rollback run is given is read back through the inventory door, as pyinfra reads it."""

import subprocess

from modelfleet.fleet import rollout
from modelfleet.plan.inventory import open_inventory
from modelfleet.plan.inventory.door import parse_data

NEW = "vllm/vllm-openai:v0.35.0"
OLD_ONE, OLD_TWO = "vllm/vllm-openai:v0.34.0", "vllm/vllm-openai:v0.33.0"
REV_ONE, REV_TWO = "1a" * 20, "2b" * 20

INVENTORY = f"""
lab = [("h1", {{"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm",
                "image": {NEW!r}, "revision": "main",
                "services": [{{"pool": "one", "port": 18001}}, {{"pool": "two", "port": 18002}}]}}),
       ("h2", {{"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm",
                "image": {NEW!r}, "pool": "three", "port": 18003}})]
"""


def upgrade_failing_its_gate(monkeypatch, tmp_path, ran: dict[str, list[tuple[str, str]]]):
    """The rollout of the inventory over hosts that ran `ran` (host -> [(image, revision)] per service), the
    first serve run of each batch failing its gate; (report, the rollback runs' --data pairs by host)."""
    inventory = tmp_path / "inventory.py"
    inventory.write_text(INVENTORY)
    resolved = open_inventory(str(inventory))
    assert not resolved.errors, resolved.errors
    before = [{"host": host, "reachable": True, "driver": None, "boot": None, "services": [
        {"pool": svc.pool, "unit": svc.unit_name, "image": image, "revision": revision, "health": "200",
         "endpoint": "x"} for svc, (image, revision) in zip(resolved.hosts[host].services, images, strict=True)]}
        for host, images in ran.items()]
    monkeypatch.setattr(rollout.fleet_status, "status", lambda plans: [r for r in before if r["host"] in
                                                                {p.name for p in plans}])
    monkeypatch.setattr(rollout.Watcher, "_watch", lambda self: None)
    runs = []

    def run_pyinfra(inventory, deploy, limit, env, timeout, extra):
        runs.append((deploy, list(limit), list(extra)))
        failed = deploy.endswith(".serve") and len([r for r in runs if r[0] == deploy]) == 1  # the gate fails
        return subprocess.CompletedProcess([], 1 if failed else 0, "", "")

    monkeypatch.setattr(rollout, "run_pyinfra", run_pyinfra)
    report = rollout.rollout(str(inventory), resolved, parallel=2, min_healthy=0, log=lambda line: None)
    serves = [(hosts, extra) for deploy, hosts, extra in runs if deploy.endswith(".serve")][1:]
    return report, {hosts[0]: [extra[i + 1] for i, a in enumerate(extra) if a == "--data"] for hosts, extra in serves}


def test_every_service_of_a_host_goes_back_on_what_it_ran(monkeypatch, tmp_path):
    report, data = upgrade_failing_its_gate(monkeypatch, tmp_path, {"h1": [(OLD_ONE, REV_ONE), (OLD_ONE, REV_ONE)],
                                                                     "h2": [(OLD_TWO, REV_TWO)]})
    assert "gate failed" in report["stopped"] and report["upgraded"] == []
    assert [(r["host"], r["ok"]) for r in report["rolled_back"]] == [("h1", True), ("h2", True)]
    for host, pairs in data.items():  # each rollback run resolved as pyinfra would run it
        back = open_inventory(str(tmp_path / "inventory.py"), data=parse_data(pairs))
        assert not back.errors, back.errors  # the --data reaches every host: it must leave them all valid
        want = {"h1": (OLD_ONE, REV_ONE), "h2": (OLD_TWO, REV_TWO)}[host]
        assert {(s.image, s.revision) for s in back.hosts[host].services} == {want}


def test_a_host_whose_services_ran_different_images_is_named_not_put_on_the_first_ones(monkeypatch, tmp_path):
    report, data = upgrade_failing_its_gate(monkeypatch, tmp_path, {"h1": [(OLD_ONE, REV_ONE), (OLD_TWO, REV_TWO)],
                                                                     "h2": [(OLD_TWO, REV_TWO)]})
    assert "h1" not in data and "h2" in data  # no run puts h1's second service on its first one's image
    refused = next(r for r in report["rolled_back"] if r["host"] == "h1")
    assert refused["ok"] is False and f"one: {OLD_ONE} at {REV_ONE}; two: {OLD_TWO} at {REV_TWO}" in refused["refused"]
    assert "(not h1: see rolled_back)" in report["stopped"]
