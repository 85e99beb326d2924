"""`upgrade`, `converge` and `retire` say what they will do and ask before acting, unless -y; where stdin is not
a terminal they refuse to ask (exit 2, saying to pass -y) before anything runs or connects. An upgrade that takes
a model's only endpoint down (a single host, a single multi-node pool) needs --allow-outage, and the refusal names
the model and its hosts."""

from __future__ import annotations

import json
import subprocess

import pytest
from click.testing import CliRunner

from modelfleet.cli import main, operate
from modelfleet.fleet import rollout, shards
from modelfleet.run import retire
from tests.helpers.cli_runner import H200, PIN, inventory

TRAYS = {"hardware": "gb300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": PIN, "pool": "k31"}


@pytest.fixture
def acted(monkeypatch):
    """What ran: each rollout, converge and retire pass the commands started (nothing connects)."""
    calls = []
    monkeypatch.setattr(rollout, "rollout", lambda *a, **k: calls.append("upgrade") or {"stopped": None})
    monkeypatch.setattr(shards, "converge", lambda *a, **k: calls.append("converge") or {"ok": True})
    unit = {"unit": "modelfleet-gone.service", "what": "pool gone", "container": None, "port": 8000}
    monkeypatch.setattr(retire, "run", lambda targets, served, deploy, dry, *a: calls.append(
        f"retire dry={dry}") or {"dry": dry, "ok": True, "checkpoints_removed": False, "output": "",
                                 "hosts": [{"host": t.given, "retired": [] if "nothing" in calls else [unit]}
                                           for t in targets]})

    def refused(*args, **kwargs):
        raise AssertionError(f"started {args}")

    monkeypatch.setattr(subprocess, "run", refused)
    return calls


@pytest.fixture
def fleet(tmp_path):
    return inventory(tmp_path, {"g1": {**H200, "ssh_hostname": "10.0.0.3"}, "g2": {**H200, "ssh_hostname": "10.0.0.4"}})


COMMANDS = [("upgrade",), ("converge",), ("retire", "10.0.0.9")]


@pytest.mark.parametrize("command", COMMANDS)
def test_without_a_terminal_nothing_is_done_and_it_says_to_pass_y(fleet, acted, command):
    out = CliRunner().invoke(main, [command[0], fleet, *command[1:]])
    assert out.exit_code == 2 and acted == [], out.output
    assert "stdin is not a terminal" in out.output and "pass -y (--yes)" in out.output


@pytest.mark.parametrize("command,ran",
                         list(zip(COMMANDS, [["upgrade"], ["converge"], ["retire dry=False"]], strict=True)))
def test_y_acts_without_asking(fleet, acted, command, ran):
    out = CliRunner().invoke(main, [command[0], fleet, *command[1:], "-y"])
    assert out.exit_code == 0 and acted == ran, out.output
    assert "?" not in out.stderr


@pytest.mark.parametrize("command,plan,ran", list(zip(COMMANDS, [
    ["modelfleet upgrade: 2 batch(es)", "batch 1: g1", "batch 2: g2", "Upgrade these 2 host(s)? [y/N]"],
    ["modelfleet converge: modelfleet.run.deploys.serve on 2 host(s) in 1 pyinfra process(es)", "shard 1: g1, g2",
     "Run modelfleet.run.deploys.serve on these 2 host(s)? [y/N]"],
    ["10.0.0.9: would retire modelfleet-gone.service (pool gone), port 8000", "Retire these units? [y/N]"]],
    [["upgrade"], ["converge"], ["retire dry=True", "retire dry=False"]], strict=True)))
def test_at_a_terminal_it_shows_the_plan_and_acts_only_on_yes(fleet, acted, monkeypatch, command, plan, ran):
    monkeypatch.setattr(operate, "stdin_is_terminal", lambda: True)
    no = CliRunner().invoke(main, [command[0], fleet, *command[1:]], input="\n")
    assert no.exit_code == 1 and "nothing done" in no.stderr, no.output
    assert all(line in no.stderr for line in plan), no.stderr
    assert acted == ran[:-1] if command[0] == "retire" else acted == []  # retire's plan is its dry pass
    acted.clear()
    yes = CliRunner().invoke(main, [command[0], fleet, *command[1:]], input="y\n")
    assert yes.exit_code == 0 and acted == ran, yes.output


def test_retire_asks_nothing_where_no_host_holds_a_unit_to_retire(fleet, acted, monkeypatch):
    monkeypatch.setattr(operate, "stdin_is_terminal", lambda: True)
    acted.append("nothing")
    out = CliRunner().invoke(main, ["retire", fleet, "10.0.0.9", "--json"])
    assert out.exit_code == 0 and acted == ["nothing", "retire dry=True"], out.output
    assert "?" not in out.stderr and json.loads(out.stdout)["hosts"] == [{"host": "10.0.0.9", "retired": []}]


def test_dry_runs_never_ask(fleet, acted):
    for argv in (["converge", fleet, "--dry"], ["retire", fleet, "10.0.0.9", "--dry"]):
        out = CliRunner().invoke(main, argv)
        assert out.exit_code == 0 and "stdin is not a terminal" not in out.output, out.output


@pytest.mark.parametrize("hosts,words", [
    ({"g1": H200}, "batch 1 (g1) takes the only endpoint of qwen3-8b (host g1) down"),
    ({"t1": {**TRAYS, "ssh_hostname": "10.0.0.1"}, "t2": {**TRAYS, "ssh_hostname": "10.0.0.2"}},
     "batch 1 (t1, t2) takes the only endpoint of kimi-k3.1-pro (pool k31 on t1, t2) down"),
])
def test_an_upgrade_that_takes_a_models_only_endpoint_down_needs_allow_outage(tmp_path, acted, hosts, words):
    inv = inventory(tmp_path, hosts)
    out = CliRunner().invoke(main, ["upgrade", inv, "-y"])
    assert out.exit_code == 2 and words in out.output and "--allow-outage" in out.output and acted == [], out.output
    dry = CliRunner().invoke(main, ["upgrade", inv, "--dry"])
    assert dry.exit_code == 2 and words in dry.output  # the preview refuses what the run refuses
    allowed = CliRunner().invoke(main, ["upgrade", inv, "-y", "--allow-outage"])
    assert allowed.exit_code == 0 and acted == ["upgrade"], allowed.output
    assert json.loads(allowed.stdout) == {"stopped": None}


def test_a_model_served_twice_needs_no_allow_outage_one_host_at_a_time(fleet, acted):
    out = CliRunner().invoke(main, ["upgrade", fleet, "-y"])
    assert out.exit_code == 0 and acted == ["upgrade"], out.output
