"""modelfleet.cli.lab: the lab commands run only from a checkout."""

from __future__ import annotations

import json

from tests.helpers.cli_runner import run


def test_lab_runs_only_from_a_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = run("lab", "status")
    assert out.exit_code == 1 and "runs from the root of a modelfleet checkout" in out.output


def test_lab_personas_lists_every_persona_and_the_fault_each_carries(monkeypatch):
    from tests.conftest import ROOT

    monkeypatch.chdir(ROOT)
    out = run("lab", "personas")
    assert out.exit_code == 0, out.output
    personas = json.loads(out.output)
    assert personas["h200x1"] == {"hardware": "h200", "gpus": 1, "bare": False, "fault_of": None}
    assert personas["h200x1-bare"]["bare"] is True
    assert any(p["fault_of"] == "h200x1" for p in personas.values())  # a fault persona names its base


def test_lab_up_refuses_an_unknown_persona_before_starting_anything(monkeypatch):
    from tests.conftest import ROOT

    monkeypatch.chdir(ROOT)
    out = run("lab", "up", "--hosts", "1", "--persona", "no-such-board")
    assert out.exit_code == 2 and "unknown persona no-such-board" in out.output and "h200x1" in out.output
