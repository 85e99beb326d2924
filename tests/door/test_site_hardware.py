"""A site's own boards: a `hardware/` folder beside the inventory, in the catalog's format, read through the
one door (validate, plan, render, the run) as `recipes/` is; a site board never shadows a shipped one without
`overrides:`. The workstation example (inventories/workstation) validates, plans its GPU/RAM split and renders."""

from __future__ import annotations

import json
import shutil

import yaml
from click.testing import CliRunner

from modelfleet.cli import main
from modelfleet.plan.catalog import CATALOG_DIR
from modelfleet.plan.inventory.door import open_inventory
from tests.conftest import ROOT

WORKSTATION = ROOT / "inventories" / "workstation" / "ws.py"


def test_the_workstation_example_validates_plans_its_split_and_renders():
    result = open_inventory(str(WORKSTATION))
    assert result.errors == [] and result.hosts["ws"].hardware.id == "rtx-pro-6000-ws"
    assert result.site_hardware_files[0].endswith("hardware/rtx-pro-6000-ws.yaml")
    plan = CliRunner().invoke(main, ["plan", str(WORKSTATION), "ws", "--json"])
    assert plan.exit_code == 0, plan.output
    report = json.loads(plan.stdout)[0]
    text = CliRunner().invoke(main, ["plan", str(WORKSTATION), "ws"]).output
    assert "in host RAM:" in text and "of 768 GiB" in text and "over 2 GPU(s)" in text, text
    assert report["fits"] and report["recipe"] == "kimi-k3-llamacpp-iq1-m-rtx-pro-6000-ws"
    render = CliRunner().invoke(main, ["render", str(WORKSTATION), "ws", "--json"])
    assert render.exit_code == 0, render.output
    unit = json.loads(render.stdout)["files"][0]["content"]
    assert "llama.cpp flags checked against llama.cpp b11669's recorded flag list (site recipe)" in " ".join(
        json.loads(render.stdout)["notes"])
    assert "nvidia.com/gpu=0" in unit and "nvidia.com/gpu=1" in unit and "--fit on" in unit


def test_a_site_board_may_not_shadow_a_shipped_one_without_overrides(tmp_path):
    inv = tmp_path / "inv.py"
    inv.write_text("hosts = [('h1', {'ssh_hostname': '192.0.2.10', 'hardware': 'h200', 'gpu_count': 1, "
                   "'model': 'qwen3-8b', 'engine': 'vllm'})]\n")
    (tmp_path / "hardware").mkdir()
    shipped = yaml.safe_load((CATALOG_DIR / "hardware" / "h200.yaml").read_text())
    board = tmp_path / "hardware" / "mine.yaml"
    board.write_text(yaml.safe_dump({**shipped, "hbm_mib": 1024}))
    errors = open_inventory(str(inv)).errors
    assert errors and "mine.yaml" in errors[0][0] and "shipped board" in errors[0][2]
    board.write_text(yaml.safe_dump({**shipped, "hbm_mib": 1024, "overrides": "h200"}))
    result = open_inventory(str(inv))
    assert result.hosts["h1"].hardware.hbm_mib == 1024  # the site's board, on purpose
    board.write_text(yaml.safe_dump({**shipped, "id": "mine", "gpus_per_node": 720}))
    errors = open_inventory(str(inv)).errors
    assert errors[0][2].startswith("gpus_per_node:"), errors


def test_the_example_is_copied_whole(tmp_path):
    """The example's folder is what a site copies: it works from anywhere."""
    copy = tmp_path / "site"
    shutil.copytree(WORKSTATION.parent, copy)
    assert open_inventory(str(copy / "ws.py")).errors == []
