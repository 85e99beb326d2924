"""A batch whose gate fails is put back: EVERY service of each host on the image and revision it ran before,
each its own (a host-level `--data image=` gave every service the first one's, and left an entry that names its
own image untouched). What the rollback run is given is read back through the inventory door, as pyinfra reads it."""

import shlex
import subprocess

from modelfleet import rollout
from modelfleet.inventory import open_inventory
from modelfleet.inventory.door import parse_data

NEW_ONE, NEW_TWO = "vllm/vllm-openai:v0.35.0", "vllm/vllm-openai:v0.35.1"
OLD_ONE, OLD_TWO = "vllm/vllm-openai:v0.34.0", "vllm/vllm-openai:v0.33.0"
REV_ONE, REV_TWO = "1" * 40, "2" * 40

INVENTORY = f"""
lab = [("h1", {{"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm",
                "image": {NEW_ONE!r}, "revision": "main",
                "services": [{{"pool": "one", "port": 18001}},
                             {{"pool": "two", "port": 18002, "image": {NEW_TWO!r}}}]}})]
"""


def test_a_failed_gate_puts_each_service_of_the_host_back_on_its_own_image_and_revision(monkeypatch, tmp_path):
    inventory = tmp_path / "inventory.py"
    inventory.write_text(INVENTORY)
    resolved = open_inventory(str(inventory))
    assert not resolved.errors, resolved.errors
    before = [{"host": "h1", "reachable": True, "driver": None, "boot": None, "services": [
        {"pool": "one", "unit": "modelfleet-one.service", "image": OLD_ONE, "revision": REV_ONE, "health": "200",
         "endpoint": "x"},
        {"pool": "two", "unit": "modelfleet-two.service", "image": OLD_TWO, "revision": REV_TWO, "health": "200",
         "endpoint": "y"}]}]
    monkeypatch.setattr(rollout.fleet, "status", lambda plans: before)
    monkeypatch.setattr(rollout.Watcher, "_watch", lambda self: None)
    runs = []

    def run_pyinfra(inventory, deploy, limit, env, timeout, extra):
        runs.append((deploy, list(extra)))
        failed = deploy.endswith(".serve") and len([r for r in runs if r[0] == deploy]) == 1  # the gate fails
        return subprocess.CompletedProcess([], 1 if failed else 0, "", "")

    monkeypatch.setattr(rollout, "run_pyinfra", run_pyinfra)
    report = rollout.rollout(str(inventory), resolved, parallel=1, min_healthy=0, log=lambda line: None)
    assert "gate failed" in report["stopped"] and report["upgraded"] == []
    assert report["rolled_back"] == [{"host": "h1", "ok": True, "services": [
        {"pool": "one", "image": OLD_ONE, "revision": REV_ONE}, {"pool": "two", "image": OLD_TWO, "revision": REV_TWO}]}]
    deploy, extra = runs[-1]
    assert deploy.endswith(".serve")
    # The rollback run's --data, as pyinfra parses it (values pass through a shell-free argv: no quoting).
    pairs = [extra[i + 1] for i, arg in enumerate(extra) if arg == "--data"]
    assert all(shlex.split(shlex.quote(p)) == [p] for p in pairs)
    back = open_inventory(str(inventory), data=parse_data(pairs))
    assert not back.errors, back.errors
    assert [(s.pool, s.image, s.revision) for s in back.hosts["h1"].services] == [
        ("one", OLD_ONE, REV_ONE), ("two", OLD_TWO, REV_TWO)]
