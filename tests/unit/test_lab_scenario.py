"""The lab's scenario (lab/scenario.py): its file's defaults, a written one read back, bad fields refused by name,
and inventories/lab.py making different hosts of two scenarios over the same lab (a hosts.json written here)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab import scenario
from modelfleet.plan.inventory import open_inventory

ROOT = Path(__file__).resolve().parents[2]
ENGINES = ["vllm", "sglang", "llama.cpp"]


def test_no_file_is_every_default(tmp_path):
    loaded = scenario.load(tmp_path / "scenario.json")
    assert loaded == scenario.Scenario()
    assert (loaded.only, loaded.engine, loaded.checkpoint_group, loaded.gate_hosts, loaded.fanout_width) == (
        [], None, "lab", 0, 8)


def test_a_written_scenario_reads_back_and_holds_only_what_was_set(tmp_path):
    path = tmp_path / "scenario.json"
    written = scenario.write(path, only=["mflab-1", "mflab-2"], engine="vllm", gate_min_busbw=2.5,
                             engine_env={"LAB_NOTE": "b"}, checkpoint_group=None, nvme=True)
    assert scenario.load(path) == written
    assert written.only == ["mflab-1", "mflab-2"] and written.checkpoint_group is None and written.fanout_width == 8
    assert json.loads(path.read_text()) == {"only": ["mflab-1", "mflab-2"], "engine": "vllm", "gate_min_busbw": 2.5,
                                            "engine_env": {"LAB_NOTE": "b"}, "checkpoint_group": None, "nvme": True}


@pytest.mark.parametrize("fields, said", [
    ({"gate_host": 2}, "no scenario field gate_host"),
    ({"gate_hosts": "2"}, 'gate_hosts must be int, not "2"'),
    ({"dcgm_level": True}, "dcgm_level must be int, not true"),
    ({"only": "mflab-1"}, "only must be list[str]"),
    ({"engine_env": {"A": 1}}, "engine_env must be dict[str, str]"),
    ({"revision": 1}, "revision must be str | None, not 1"),
])
def test_an_unknown_field_or_a_wrong_type_is_refused_by_name(tmp_path, fields, said):
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(fields))
    with pytest.raises(ValueError, match="^" + str(path).replace(".", r"\.") + ": " + said.replace("[", r"\[")
                       .replace("|", r"\|")):
        scenario.load(path)
    with pytest.raises(ValueError, match=said.replace("[", r"\[").replace("|", r"\|")):
        scenario.write(path, **fields)


def test_applied_restores_the_file_it_found(tmp_path):
    path = tmp_path / "scenario.json"
    scenario.write(path, engine="sglang")
    with scenario.applied(path, engine="vllm", gate_hosts=2):
        assert scenario.load(path).engine == "vllm"
    assert json.loads(path.read_text()) == {"engine": "sglang"}
    path.unlink()
    with scenario.applied(path, gate_hosts=2):
        assert path.exists()
    assert not path.exists()


def test_the_command_line_runs_one_command_under_a_scenario_and_refuses_a_bad_value(tmp_path):
    env = {"MODELFLEET_LAB_STATE": str(tmp_path), "PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, str(ROOT / "lab" / "scenario.py"), "gate_hosts=2", "only=mflab-1,mflab-2",
                          "--", "cat", str(tmp_path / "scenario.json")], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {"gate_hosts": 2, "only": ["mflab-1", "mflab-2"]}
    assert not (tmp_path / "scenario.json").exists()
    bad = subprocess.run([sys.executable, str(ROOT / "lab" / "scenario.py"), "gate_hosts=two"], env=env,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "gate_hosts must be int, not 'two'" in bad.stderr


@pytest.fixture
def lab_state(tmp_path, monkeypatch):
    """A lab of two H200 hosts and an 8x B300 as `lab up` records it (hosts.json), no hub: what the inventory reads."""
    hosts = [{"name": f"mflab-{i}", "address": f"127.0.1.{i}", "persona": "h200x1" if i < 3 else "b300x8-synthetic",
              "hardware": "h200" if i < 3 else "b300", "gpu_count": 1 if i < 3 else 8, "engine": ENGINES[i - 1],
              "bare": False, "admission": False, "disks": [f"/dev/loop{i}"],
              "model_root": f"/srv/mflab-{i}/models", "config_dir": f"/srv/mflab-{i}/etc-modelfleet"}
             for i in (1, 2, 3)]
    (tmp_path / "hosts.json").write_text(json.dumps({
        "key": str(tmp_path / "id_ed25519"), "known_hosts": str(tmp_path / "known_hosts"),
        "registry": "127.0.0.1:5001", "apt": {}, "hub": None, "hosts": hosts}))
    monkeypatch.setenv("MODELFLEET_LAB_STATE", str(tmp_path))
    return tmp_path


def inventory() -> dict:
    result = open_inventory(str(ROOT / "inventories" / "lab.py"), offline=True)
    assert not result.errors, result.errors
    return result.data


def test_the_inventory_makes_the_ordinary_fleet_of_no_scenario_and_another_of_a_written_one(lab_state):
    plain = inventory()
    assert list(plain) == ["mflab-1", "mflab-2", "mflab-3"]
    assert [plain[n]["engine"] for n in plain] == ENGINES
    assert {(d["pool"], d["checkpoint_group"], d["revision"], d["model_fanout_width"], tuple(d["nvme_devices"]))
            for d in plain.values()} == {(f"tiny-{n}", "lab", None, 8, ()) for n in plain}
    assert "image" not in plain["mflab-1"] and plain["mflab-1"]["bind_address"] == "127.0.1.1"

    scenario.write(lab_state / "scenario.json", only=["mflab-1", "mflab-2"], gate_hosts=2, gate_min_busbw=3.0,
                   revision="v1.0", nvme=True, fanout_width=2, fanout_rate_mb_s=100, checkpoint_group=None)
    gate = inventory()
    assert list(gate) == ["mflab-1", "mflab-2"]
    for name, data in gate.items():
        assert (data["pool"], data["recipe"], data["engine"], data["netcheck_min_busbw_gbps"]) == (
            "gate", "tiny-lab-vllm-dp2", "vllm", 3.0)
        assert (data["revision"], data["checkpoint_group"], data["model_fanout_width"],
                data["model_fanout_rate_mb_s"]) == ("v1.0", None, 2, 100)
        assert data["nvme_devices"] == [f"/dev/loop{name[-1]}"]

    scenario.write(lab_state / "scenario.json", two_pools="mflab-3", only=["mflab-3"], pair_b_env={"LAB_NOTE": "b"})
    [(name, pair)] = inventory().items()
    assert name == "mflab-3"
    assert [(s["pool"], s["port"], s["env"]) for s in pair["services"]] == [
        ("pair-a", 8000, {}), ("pair-b", 8001, {"LAB_NOTE": "b"})]


def test_the_real_vllm_as_replicas_and_as_a_two_host_pool(lab_state):
    scenario.write(lab_state / "scenario.json", real_vllm="mflab-1", real_vllm_replicas=["mflab-2"])
    fleet = inventory()
    for name in ("mflab-1", "mflab-2"):  # two replicas of one model, one checkpoint group (a joiner copies)
        assert (fleet[name]["pool"], fleet[name]["recipe"], fleet[name]["model"], fleet[name]["checkpoint_group"]) \
            == (f"tiny-{name}", "tiny-llama-vllm-cpu", "tiny-llama", "tiny-llama")
    assert fleet["mflab-3"]["recipe"] == "tiny-lab-llamacpp"

    scenario.write(lab_state / "scenario.json", gate_hosts=2, real_vllm_pool=True, only=["mflab-1", "mflab-2"])
    pool = inventory()
    assert {(d["pool"], d["recipe"], d["model"], d["port"]) for d in pool.values()} == {
        ("gate", "tiny-llama-vllm-cpu-dp2", "tiny-llama", 8100)}


def test_the_inventory_refuses_a_scenario_with_a_wrong_field_naming_it(lab_state):
    (lab_state / "scenario.json").write_text(json.dumps({"gate_hosts": "2"}))
    result = open_inventory(str(ROOT / "inventories" / "lab.py"), offline=True)
    assert any("gate_hosts must be int" in message for _, _, message in result.errors), result.errors


@pytest.mark.parametrize("engine,router_only", [("vllm", False), ("vllm", True), ("sglang", False)])
def test_only_the_host_of_a_vllm_front_door_turns_its_router_firewall_off(lab_state, engine, router_only):
    """router_worker_firewall applies only to a front door whose router checks no key (vLLM's): the lab turns it
    off there alone (elsewhere it would be refused)."""
    scenario.write(lab_state / "scenario.json", engine=engine, router="mflab-1", router_only=router_only,
                   api_key_env="MODELFLEET_LAB_KEY")
    fleet = inventory()
    off = {name for name, data in fleet.items() if data.get("router_worker_firewall") is False}
    assert off == ({"mflab-1"} if engine == "vllm" else set()), fleet
