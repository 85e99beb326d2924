"""`upgrade --dry` per batch: each host's image, revision and driver, what it runs now (read from it) against
what the inventory says, and the batch's drain (out of its front door; units stopped for a driver upgrade)."""

import json

from click.testing import CliRunner

from modelfleet.cli import main
from modelfleet.fleet import status as fleet_status
from modelfleet.fleet.upgrade_dry import preview
from modelfleet.plan.inventory import resolve

OLD = "127.0.0.1:5000/vllm/vllm-openai:v0.33.0@sha256:" + "a" * 64
NEW_TAG = "vllm/vllm-openai:v0.34.0"


def replica(port: int, **more) -> dict:
    return {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "sglang", "recipe": "tiny-lab-sglang",
            "port": port, "router": "r1", "router_bind_address": "127.0.0.1", "api_key_env": "MF_DRY_KEY",
            "fabric_address": f"127.0.0.{port - 18010}", "pool": f"p{port}", **more}


def row(host, image, revision, driver=None, reachable=True):
    return {"host": host, "reachable": reachable, "driver": driver, "error": None if reachable else "timed out",
            "services": [{"pool": f"p{18010 + (1 if host == 'r1' else 2)}", "image": image, "revision": revision}]}


def test_each_host_old_to_new_and_the_front_door_drain(monkeypatch):
    monkeypatch.setenv("MF_DRY_KEY", "dry-run-key-0123456789")
    resolved = resolve([("r1", replica(18011, image=NEW_TAG)), ("a", replica(18012, image=OLD, revision="b" * 40))])
    assert not resolved.errors, resolved.errors
    rows = [row("r1", OLD, "a" * 40), row("a", OLD, "a" * 40)]
    out = preview(resolved, resolved, 1, rows)["batches"]
    assert [b["hosts"] for b in out] == [["r1"], ["a"]]
    [r1] = out[0]["changes"]["r1"]["services"]
    assert r1["image"] == {"old": OLD, "new": NEW_TAG, "changes": True}
    assert r1["revision"]["changes"] is None and "resolves it to a commit" in r1["revision"]["note"]
    [a] = out[1]["changes"]["a"]["services"]
    assert a["image"]["changes"] is False and a["revision"] == {"old": "a" * 40, "new": "b" * 40, "changes": True}
    drain = out[1]["drain"]
    assert [d["replica"] for d in drain["out_of_front_doors"]] == ["http://127.0.0.2:18012"]
    assert "out of tiny-lab before the switch" in drain["summary"] and drain["units_stopped_for_driver"] == []


def test_same_tag_is_not_called_a_change_and_an_unread_host_says_so(monkeypatch):
    monkeypatch.setenv("MF_DRY_KEY", "dry-run-key-0123456789")
    resolved = resolve([("r1", replica(18011, image=NEW_TAG))])
    same = preview(resolved, resolved, 1, [row("r1", NEW_TAG + "@sha256:" + "c" * 64, "main")])["batches"][0]
    image = same["changes"]["r1"]["services"][0]["image"]
    assert image["changes"] is None and "pins its digest again" in image["note"]
    unread = preview(resolved, resolved, 1, [row("r1", None, None, reachable=False)])["batches"][0]
    assert unread["changes"]["r1"]["reachable"] is False and "timed out" in unread["changes"]["r1"]["note"]
    assert unread["changes"]["r1"]["services"][0]["image"]["changes"] is None


def test_a_driver_release_drains_the_batch():
    resolved = resolve([("g1", {"hardware": "h200", "gpu_count": 1, "model": "qwen3-8b", "engine": "vllm",
                                "driver_version": "580.159.04"})])
    assert not resolved.errors, resolved.errors
    batch = preview(resolved, resolved, 1, [{"host": "g1", "reachable": True, "driver": "580.95.05",
                                             "services": []}])["batches"][0]
    assert batch["changes"]["g1"]["driver"] == {"old": "580.95.05", "new": "580.159.04", "changes": True}
    assert batch["drain"]["units_stopped_for_driver"] == [resolved.hosts["g1"].services[0].unit_name]
    assert "stopped and disabled for the driver upgrade" in batch["drain"]["summary"]


def test_cli_dry_reads_the_hosts_and_prints_json(tmp_path, monkeypatch):
    inv = tmp_path / "inv.py"
    inv.write_text("gpus = [('g1', {'hardware': 'h200', 'gpu_count': 1, 'model': 'qwen3-8b', 'engine': 'vllm'})]\n")
    asked = []
    monkeypatch.setattr(fleet_status, "status", lambda plans: asked.append([p.name for p in plans]) or
                        [{"host": "g1", "reachable": True, "driver": "580.95.05", "services": [
                            {"pool": "g1", "image": "vllm/vllm-openai:v0.33.0@sha256:" + "d" * 64,
                             "revision": "e" * 40}]}])
    done = CliRunner().invoke(main, ["upgrade", "--dry", "--allow-outage", str(inv)])
    assert done.exit_code == 0, done.output
    [batch] = json.loads(done.output)["batches"]
    assert asked == [["g1"]] and batch["changes"]["g1"]["services"][0]["image"]["changes"] is True
