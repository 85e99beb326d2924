"""modelfleet.cli.lab: the lab commands run only from a checkout."""

from __future__ import annotations

from tests.helpers.cli_runner import run


def test_lab_runs_only_from_a_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = run("lab", "status")
    assert out.exit_code == 1 and "runs from the root of a modelfleet checkout" in out.output
