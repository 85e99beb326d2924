"""The shell snippets and the Python parsers of modelfleet.base.host_commands read recorded outputs the same way:
each snippet runs in a real shell against a stand-in tool that prints the recording."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from modelfleet.base import host_commands as hc

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
H200_VERSION = FIXTURES / "gpu-hosts" / "h200x1-ubuntu2404" / "nvidia-smi-version.txt"
B300_FABRIC_MANAGER = FIXTURES / "public-samples" / "b300x7-nv-fabricmanager-version.txt"
# assumed: R610 renames the labels in `--version` as its banner does (public sample)
R610_VERSION = "NVIDIA-SMI version  : 610.57.04\nNVML version        : 610.57\nKMD version         : 610.57.04\n" \
               "CUDA UMD Version    : 13.3\n"


def recorded(path: Path) -> str:
    text = path.read_text()
    if "\n# ---\n" in text:
        text = text.split("\n# ---\n", 1)[1]
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("__rc="))


def run_with_tool(tmp_path: Path, tool: str, output: str, snippet: str) -> str:
    """Run `snippet` in sh with `tool` on PATH printing `output` (for any arguments)."""
    (tmp_path / "out.txt").write_text(output)
    stub = tmp_path / tool
    stub.write_text(f"#!/bin/sh\ncat {tmp_path / 'out.txt'}\n")
    stub.chmod(0o755)
    return subprocess.run(["sh", "-c", snippet], env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, capture_output=True,
                          text=True, check=False).stdout.strip()


@pytest.mark.parametrize("output,driver", [(recorded(H200_VERSION), "580.159.04"), (R610_VERSION, "610.57.04")])
def test_driver_version_reads_the_same_in_shell_and_python(tmp_path, output, driver):
    assert hc.parse_nvidia_versions(output.splitlines())["driver"] == driver
    assert run_with_tool(tmp_path, "nvidia-smi", output, hc.driver_version_sh()) == driver


def test_fabric_manager_version_reads_the_same_in_shell_and_python(tmp_path):
    output = recorded(B300_FABRIC_MANAGER)
    assert hc.parse_fabric_manager_version(output.splitlines()) == "610.57.04"
    assert run_with_tool(tmp_path, "nv-fabricmanager", output, hc.fabric_manager_version_sh()) == "610.57.04"
    assert run_with_tool(tmp_path, "elsewhere", "", hc.fabric_manager_version_sh()) == ""  # not installed


def test_gpu_count_counts_the_recorded_listing(tmp_path):
    listing = recorded(FIXTURES / "gpu-hosts" / "h200x1-ubuntu2404" / "nvidia-smi-L.txt")
    assert run_with_tool(tmp_path, "nvidia-smi", listing, hc.nvidia_gpu_count_sh()) == "1"


def test_unit_commands_quote_names_and_read_back_properties():
    assert hc.unit_show_command("a b.service", ["ActiveState"]) == "systemctl show -p ActiveState -- 'a b.service'"
    assert hc.unit_show_command('"$u"', ["ActiveState"]).endswith('-- "$u"')
    assert hc.journal_command("x.service", 40, follow=True, iso=True) == \
        "journalctl -u x.service -n 40 --no-pager -o short-iso -f"
    assert hc.parse_unit_show(["ActiveState=active", "NRestarts=0", "noise"]) == {"ActiveState": "active",
                                                                                    "NRestarts": "0"}


def test_deployed_state_asks_systemctl_about_each_unit_by_name(tmp_path):
    """The fact's loop hands each unit name to systemctl (a quoting slip once sent the literal '$u')."""
    from modelfleet.host.facts.state import DeployedState

    fact = DeployedState()
    stub = 'case "$*" in *"-- demo.service") echo ActiveState=active; echo UnitFileState=enabled;; esac'
    (tmp_path / "systemctl").write_text(f"#!/bin/sh\n{stub}\n")
    (tmp_path / "systemctl").chmod(0o755)
    out = subprocess.run(["sh", "-c", fact.command(units=("demo.service",))], capture_output=True, text=True,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"}).stdout
    assert fact.process(out.splitlines())["units"]["demo.service"] == {"ActiveState": "active",
                                                                       "UnitFileState": "enabled"}


def test_the_checkpoint_layout_is_the_one_plans_use():
    """A plan's model directory and its pinned twin follow host_commands' layout (<root>/<model>/<revision>, the
    `current` link in revisions_dir)."""
    from modelfleet.plan.inventory import resolve

    svc = resolve([("l", {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "llama.cpp",
                          "model_root": "/srv/models/"})]).hosts["l"].services[0]
    assert svc.model_dir == hc.model_dir("/srv/models/", "tiny-lab", "main") == "/srv/models/tiny-lab/main"
    pinned = svc.at_commit("a" * 40)
    assert pinned.model_dir == hc.model_dir("/srv/models", "tiny-lab", "a" * 40)
    assert hc.revisions_dir(pinned.model_dir) == hc.revisions_dir(svc.model_dir) == "/srv/models/tiny-lab"
