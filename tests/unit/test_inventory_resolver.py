import json
import subprocess
import sys

import pytest

from modelfleet.plan.inventory import resolve

PIN = "a" * 40


def b300(**extra):
    return {"hardware": "b300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": PIN,
            "pool": "k31", **extra}


@pytest.mark.slow
def test_prod_example_validates():
    out = subprocess.run([sys.executable, "-m", "modelfleet.cli", "validate", "--json", "inventories/prod.py"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads(out.stdout)
    assert set(data["pools"]) == {"kimi-k31-b300", "kimi-k31-gb300", "kimi-k3-mi355x"}
    assert data["pools"]["kimi-k31-gb300"]["hosts"] == ["gb300-tray-a", "gb300-tray-b"]


def test_resolves_one_single_node_pool():
    result = resolve([("b300-01", b300())])
    assert result.errors == []
    svc = result.hosts["b300-01"].services[0]
    assert svc.recipe.id == "kimi-k3.1-pro-vllm-b300" and svc.port == 8000 and svc.bind_address == "127.0.0.1"
    assert svc.model_dir == f"/srv/models/kimi-k3.1-pro/{PIN}"


def test_every_problem_is_reported_at_once_naming_host_and_field(monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    entries = [
        ("a", {"hardware": "b300", "model": "kimi-k9", "engine": "vllm", "pool": "p1"}),
        ("b", {"hardware": "warp-drive", "model": "kimi-k3", "engine": "vllm"}),
        ("c", b300(engine="trtllm")),
        ("d", {"hardware": "h200", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": "main"}),
        ("e", {"hardware": "mi355x", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": PIN,
               "recipe": "kimi-k3.1-pro-vllm-b300"}),
        ("f", b300(pool="f", port=70000)),
        ("g", b300(pool="g", bind_address="0.0.0.0")),
        ("h", {"hardware": "b300", "ssh_hostname": "a"}),
        ("i", {"hardware": "h200", "services": [
            {"model": "qwen3-8b", "engine": "vllm", "pool": "q1", "port": 8000},
            {"model": "qwen3-8b", "engine": "vllm", "pool": "q2", "port": 8000}]}),
        ("j", b300(pool="mixed")),
        ("k", {"hardware": "h200", "model": "qwen3-8b", "engine": "vllm", "pool": "mixed"}),
        ("l", b300(pool="l", bind_address="10.0.0.5", api_key_env="NO_SUCH_KEY_VAR")),
    ]
    errors = {(w, f) for w, f, _ in resolve(entries).errors}
    expected = {
        ("host a", "model"),            # unknown model
        ("host b", "hardware"),         # unknown hardware
        ("host c", "engine"),           # engine not in the catalog
        ("host d", "recipe"),           # no recipe for K3.1 Pro on H200
        ("host e", "recipe"),           # the named recipe is for another hardware (vendor mismatch)
        ("host f", "port"),             # outside 1-65535
        ("host g", "bind_address"),     # non-loopback bind without an API key
        ("host h", "ssh_hostname"),     # duplicate of host a
        ("host i", "port"),             # one port for two services on one host
        ("pool mixed", "hardware"),     # mixed hardware in one pool
        ("host l", "api_key_env"),      # key variable not set on the control node
    }
    assert expected <= errors, expected - errors


def test_no_recipe_names_the_recipes_there_are_and_the_next_step():
    found = {w: m for w, f, m in resolve([
        ("d", {"hardware": "h200", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": PIN}),
        ("s", {"hardware": "h200", "model": "qwen3-8b", "engine": "sglang", "revision": PIN})]).errors if f == "recipe"}
    assert found["host d"] == (
        "no recipe for model kimi-k3.1-pro with engine vllm on h200; its recipes are for other boards: "
        "kimi-k3.1-pro-sglang-b300 (sglang on b300), kimi-k3.1-pro-vllm-b300 (vllm on b300), "
        "kimi-k3.1-pro-vllm-gb300 (vllm on gb300): serve it on one of those, or add a site recipe for kimi-k3.1-pro "
        "with vllm on h200 (recipes/ beside the inventory, docs/recipes.md)")
    assert found["host s"].startswith("no recipe for model qwen3-8b with engine sglang on h200; on h200 it has "
                                      "qwen3-8b-vllm-1gpu (vllm on ")
    assert "name one with `recipe` (and its `engine`)" in found["host s"]


def test_plan_that_cannot_fit_is_refused_at_validate():
    errors = resolve([("r", {"hardware": "rtx4090", "gpu_count": 1, "model": "qwen3-8b", "engine": "vllm",
                             "gpus": 1, "pool": "r"})]).errors
    assert errors == []  # 8B BF16 fits a 24 GB card (16.4 GB)


@pytest.mark.slow
def test_validate_cli_exit_2_without_traceback(tmp_path):
    inv = tmp_path / "inventories" / "bad.py"
    inv.parent.mkdir()
    inv.write_text('hosts = [("x", {"hardware": "b300", "model": "nope", "engine": "vllm"}),\n'
                   '         ("y", {"hardware": "nope", "model": "kimi-k3", "engine": "vllm"})]\n')
    out = subprocess.run([sys.executable, "-m", "modelfleet.cli", "validate", str(inv)], capture_output=True,
                         text=True)
    assert out.returncode == 2
    assert "Traceback" not in out.stdout + out.stderr
    assert "host x:\n  model: unknown model 'nope'" in out.stdout  # grouped by host
    assert "host y:\n  hardware: unknown hardware 'nope'" in out.stdout


def test_driver_version_must_be_a_release_of_the_branch():
    assert resolve([("n1", b300(driver_version="580.159.04"))]).errors == []
    errors = resolve([("n1", b300(driver_version="590.44.01"))]).errors
    assert [(w, f) for w, f, _ in errors] == [("host n1", "driver_version")]
    assert "not a release of driver_branch 580" in errors[0][2]
    assert resolve([("n1", b300(driver_version="580.x"))]).errors  # the grammar refuses it before that
