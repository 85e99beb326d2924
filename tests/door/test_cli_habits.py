"""pyinfra's habits on modelfleet's command line: `--limit` with pyinfra's meaning, `-h`, help on every option,
`show` (each value and its origin), `catalog`, `upgrade --dry`."""

import json

import click
import pytest
from click.testing import CliRunner

from modelfleet.cli import main

INVENTORY = "inventories/prod.py"


def commands(group=main, prefix=()):
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from commands(command, (*prefix, name))
        else:
            yield (*prefix, name), command


def one_host(tmp_path, name: str, **data):
    """An inventory of one pre-built 1x H200 host, its revision pinned; `data` adds to or replaces its data."""
    inv = tmp_path / "inv.py"
    host = {"hardware": "h200", "model": "qwen3-8b", "engine": "vllm", "gpu_stack": False, "gpu_count": 1,
            "revision": "0123456789abcdef0123456789abcdef01234567", **data}
    inv.write_text(f"gpus = [({name!r}, {host!r})]\n")
    return inv


def b300_replicas(tmp_path, names: list[str], **group):
    """Replicas of Kimi K3.1 Pro on 8x B300 hosts of group b300, set in its group_data (`group` adds to it)."""
    inv = tmp_path / "inv.py"
    inv.write_text(f"b300 = {[(n, {}) for n in names]!r}\n")
    (tmp_path / "group_data").mkdir()
    settings = {"hardware": "b300", "model": "kimi-k3.1-pro", "engine": "vllm",
                "revision": "0123456789abcdef0123456789abcdef01234567", **group}
    (tmp_path / "group_data" / "b300.py").write_text("".join(f"{k} = {v!r}\n" for k, v in settings.items()))
    return inv


def test_every_option_of_every_command_has_help():
    missing = [f"{' '.join(path)} {param.opts[0]}" for path, command in commands() for param in command.params
               if isinstance(param, click.Option) and not param.hidden and not param.help]
    assert missing == []
    assert all(command.help for _, command in commands())


def test_dash_h_is_help():
    assert CliRunner().invoke(main, ["validate", "-h"]).output.startswith("Usage:")


def test_limit_takes_groups_globs_and_names():
    from modelfleet.plan.inventory.door import limit, open_inventory

    result = open_inventory(INVENTORY)
    assert limit(result, ["gb300_kimi"]) == ["gb300-tray-a", "gb300-tray-b"]  # a group
    assert limit(result, ["*-01"]) == ["b300-01", "mi355x-01"]  # a glob, in inventory order
    assert limit(result, ["mi355x-01", "b300_kimi"]) == ["b300-01", "mi355x-01"]
    assert limit(result, ["prod"]) == list(result.hosts)  # pyinfra's group named after the file
    out = CliRunner().invoke(main, ["status", INVENTORY, "--limit", "nope"])
    assert out.exit_code == 2 and "--limit nope: no host or group matches" in out.output


def test_upgrade_dry_takes_whole_pools(monkeypatch):
    from modelfleet.fleet import status as fleet_status

    monkeypatch.setattr(fleet_status, "status", lambda plans: [])  # what the hosts run now is not the point here
    out = CliRunner().invoke(main, ["upgrade", "--dry", INVENTORY, "--limit", "gb300-tray-b"])
    assert out.exit_code == 0, out.output
    assert [(b["batch"], b["hosts"]) for b in json.loads(out.output)["batches"]] == \
        [(1, ["gb300-tray-a", "gb300-tray-b"])]


def test_show_names_each_values_origin():
    out = CliRunner().invoke(main, ["show", "--json", INVENTORY, "gb300-tray-a", "--data", "reboot=false"])
    rows = {r["key"]: r for r in json.loads(out.output)}
    assert rows["hardware"] == {"key": "hardware", "value": "gb300", "from": "inventories/group_data/gb300_kimi.py"}
    assert rows["ssh_hostname"]["from"] == "inventories/prod.py"
    assert rows["reboot"] == {"key": "reboot", "value": False, "from": "--data"}
    assert rows["model_fanout_width"]["from"] == "default"


def test_catalog_lists_recipes_by_model_board_and_engine():
    out = json.loads(CliRunner().invoke(main, ["catalog", "--json"]).output)
    recipe = out["recipes"]["kimi-k3.1-pro-vllm-gb300"]
    assert (recipe["model"], recipe["engine"], recipe["hardware"], recipe["nodes"]) == (
        "kimi-k3.1-pro", "vllm", ["gb300"], 2)
    assert set(out["models"]) >= {"kimi-k3", "kimi-k3.1-pro"}


def test_plan_of_an_inventory_host_uses_its_recipe_and_refuses_what_validate_refuses(tmp_path):
    out = CliRunner().invoke(main, ["plan", "--json", INVENTORY, "gb300-tray-a"])
    assert out.exit_code == 0, out.output
    [report] = json.loads(out.output)
    assert (report["nodes"], report["gpus_per_node"]) == (2, 4)  # the pool as written, not a flag's guess
    inv = tmp_path / "inv.py"
    inv.write_text("gpus = [('g1', {'hardware': 'h200', 'model': 'kimi-k3.1-pro', 'engine': 'vllm', "
                   "'gpu_stack': False})]\n")
    refused = CliRunner().invoke(main, ["plan", str(inv), "g1"])
    validated = CliRunner().invoke(main, ["validate", str(inv)])
    assert refused.exit_code == validated.exit_code == 2


def test_upgrade_limit_takes_the_host_not_its_checkpoint_peers(tmp_path, monkeypatch):
    """Replicas that share a checkpoint group are separate pools: upgrading one leaves the others alone (their
    copy of the revision comes from the prefetch of their own batch)."""
    from modelfleet.fleet import status as fleet_status

    monkeypatch.setattr(fleet_status, "status", lambda plans: [])
    inv = b300_replicas(tmp_path, ["r1", "r2", "r3"], checkpoint_group="kimi")
    out = CliRunner().invoke(main, ["upgrade", "--dry", str(inv), "--limit", "r2"])
    assert out.exit_code == 0, out.output
    assert [(b["batch"], b["hosts"]) for b in json.loads(out.output)["batches"]] == [(1, ["r2"])]


def test_plan_by_flags_sizes_with_a_recipe_only_for_the_layout_it_was_written_for():
    one = CliRunner().invoke(main, ["plan", "--json", "--model", "kimi-k3", "--hardware", "h200", "--gpus", "2",
                                    "--quant", "UD-IQ1_M"])
    assert json.loads(one.stdout)["recipe"] == "kimi-k3-llamacpp-iq1-m-2gpu-ram", one.output
    wide = CliRunner().invoke(main, ["plan", "--json", "--model", "kimi-k3", "--hardware", "h100", "--gpus", "8",
                                     "--nodes", "4"])
    assert json.loads(wide.stdout)["recipe"] is None
    assert "no recipe of kimi-k3 on h100 is laid out for 4x8 GPUs" in wide.stderr
    named = CliRunner().invoke(main, ["plan", "--model", "kimi-k3", "--hardware", "h200", "--gpus", "8",
                                      "--recipe", "kimi-k3-llamacpp-iq1-m-1gpu-ram"])
    assert named.exit_code == 2 and "laid out for 1x1 GPUs, not 1x8" in named.output


def test_render_says_a_gguf_model_file_pattern_is_resolved_by_the_run(tmp_path):
    inv = one_host(tmp_path, "ws1", model="kimi-k3", engine="llama.cpp", recipe="kimi-k3-llamacpp-iq1-m-1gpu-ram",
                   host_ram_gib=1024)
    out = CliRunner().invoke(main, ["render", "--json", str(inv), "ws1"])
    assert out.exit_code == 0, out.output
    rendered = json.loads(out.output)
    [unit] = [f["content"] for f in rendered["files"] if f["path"].endswith(".service")]
    [note] = [n for n in rendered["notes"] if n.startswith("model file ")]
    pattern = note.split()[2]
    assert "*" in pattern and pattern in unit and "the run names the revision's first matching file" in note


def test_limit_with_a_group_picks_its_hosts_on_every_command_that_acts_on_hosts(monkeypatch):
    """status, logs, verify, bench (through the hosts they reach) and upgrade take pyinfra's --limit GROUP."""
    from modelfleet.fleet import status as fleet_status
    from modelfleet.run.checks import bench, probe

    group = ["gb300-tray-a", "gb300-tray-b"]
    seen = {}
    monkeypatch.setattr(fleet_status, "status", lambda plans: seen.setdefault("status", [p.name for p in plans]) and [])
    monkeypatch.setattr(fleet_status, "status_table", lambda rows: "")
    monkeypatch.setattr(fleet_status, "logs", lambda plans, *a, **k: seen.setdefault("logs", [p.name for p in plans]))
    monkeypatch.setattr(probe, "verify", lambda ep, timeout: seen.setdefault("verify", []).append(ep.name) or
                        {"ok": True})
    monkeypatch.setattr(bench, "bench", lambda ep, *a, **k: seen.setdefault("bench", []).append(ep.name) or
                        {"regressions": []})
    monkeypatch.setenv("KIMI_API_KEY", "k" * 32)
    for command in (["status"], ["logs"], ["verify"], ["bench", "--no-gpu-memory"]):
        out = CliRunner().invoke(main, [*command, INVENTORY, "--limit", "gb300_kimi"])
        assert out.exit_code == 0, (command, out.output)
    assert seen["status"] == seen["logs"] == group
    # a multi-node pool has one endpoint, at its head
    assert seen["verify"] == seen["bench"] == ["gb300-tray-a/kimi-k31-gb300"]
    dry = CliRunner().invoke(main, ["upgrade", "--dry", INVENTORY, "--limit", "gb300_kimi"])
    assert json.loads(dry.output)["batches"][0]["hosts"] == group


def test_render_says_what_the_run_pins_and_render_pin_fails_in_one_line_when_it_cannot(tmp_path):
    inv = one_host(tmp_path, "g1", image_registry="127.0.0.1:1")
    plain = CliRunner().invoke(main, ["render", "--json", str(inv), "g1"])
    assert plain.exit_code == 0, plain.output
    assert any("the run pins them" in n and "render --pin" in n for n in json.loads(plain.output)["notes"])
    digest = one_host(tmp_path, "g1", image="vllm/vllm-openai:v0.34.0@sha256:" + "e" * 64)
    as_run = CliRunner().invoke(main, ["render", "--json", str(digest), "g1"])
    assert not any("the run pins them" in n for n in json.loads(as_run.output)["notes"])  # nothing left to pin
    inv = one_host(tmp_path, "g1", image_registry="127.0.0.1:1")
    pinned = CliRunner().invoke(main, ["render", "--pin", str(inv), "g1"])
    assert pinned.exit_code == 1 and "Traceback" not in pinned.output
    assert pinned.stderr.startswith("modelfleet render --pin: g1: pool g1: ") and "127.0.0.1:1" in pinned.stderr


@pytest.mark.slow
def test_upgrade_stops_on_sigint_even_when_started_with_it_ignored(tmp_path):
    """A shell without job control starts background commands with SIGINT ignored; `kill -INT` still stops the
    rollout where it is (the rollout reports it)."""
    import signal
    import subprocess
    import sys
    import time

    inv = b300_replicas(tmp_path, ["r1"])
    script = f"""
import signal, sys, time
from modelfleet import cli
from modelfleet.fleet import rollout

def slow(*args, **kwargs):
    try:  # the signal may come as soon as the line is out
        print("rolling", flush=True)
        time.sleep(60)
        return {{"stopped": None}}
    except KeyboardInterrupt:
        return {{"stopped": "interrupted"}}

rollout.rollout = slow
cli.main(["upgrade", "-y", "--allow-outage", {str(inv)!r}])
"""
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert child.stdout.readline().strip() == "rolling"
    started = time.monotonic()
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=30)
    assert '"stopped": "interrupted"' in out and child.returncode == 1
    assert time.monotonic() - started < 10
