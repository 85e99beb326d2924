"""Reports and refusals in real pyinfra runs on the local host: a report judged while planning lands only when
the run executes (never under `--dry`), a refused host runs nothing after its refusal, and MODELFLEET_REPORTS
moves every report."""

import json

import pytest

from modelfleet.base.commands import run_pyinfra
from modelfleet.host.operations import report

DEPLOY = """
from pyinfra import host
from modelfleet.host.operations.report import fail_host, note_once, report_path, save_report, write_report

save_report("verify", "pool a/b", {"judged": "while planning"})
write_report(name="Before", path=str(report_path("bench", "before")), report={"n": 1})
note_once(name="Note", message="a word for the operator")
if host.data.get("refuse"):
    fail_host(name="Refuse", reasons=["disk full", "no GPU"])
write_report(name="After", path=str(report_path("bench", "after")), report={"n": 2})
"""


def run(tmp_path, *extra, refuse=False):
    (tmp_path / "deploy.py").write_text(DEPLOY)
    (tmp_path / "inventory.py").write_text("hosts = ['@local']\n")
    reports = tmp_path / "reports"
    done = run_pyinfra("inventory.py", "deploy.py", extra=list(extra), data={"refuse": "true"} if refuse else {},
                       env={"MODELFLEET_REPORTS": str(reports)}, cwd=str(tmp_path), timeout=120)
    written = sorted(str(p.relative_to(reports)) for p in reports.rglob("*.json")) if reports.is_dir() else []
    return done, written, reports


@pytest.mark.slow
def test_a_run_writes_its_reports_where_modelfleet_reports_says(tmp_path):
    done, written, reports = run(tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert written == ["bench/after.json", "bench/before.json", "verify/pool_a_b.json"]
    assert json.loads((reports / "verify" / "pool_a_b.json").read_text()) == {"judged": "while planning"}
    assert "a word for the operator" in done.stderr + done.stdout


@pytest.mark.slow
def test_a_dry_run_writes_no_report(tmp_path):
    done, written, _ = run(tmp_path, "--dry")
    assert done.returncode == 0, done.stderr[-2000:]
    assert written == []


@pytest.mark.slow
def test_a_refused_host_fails_with_each_reason_and_runs_nothing_after(tmp_path):
    done, written, _ = run(tmp_path, refuse=True)
    assert done.returncode != 0
    output = done.stderr + done.stdout
    assert "refused: disk full" in output and "refused: no GPU" in output
    assert "bench/after.json" not in written and "bench/before.json" in written


def test_reports_land_under_reports_by_default(monkeypatch):
    monkeypatch.delenv("MODELFLEET_REPORTS", raising=False)
    assert str(report.report_path("verify", "h1")) == "reports/verify/h1.json"
    monkeypatch.setenv("MODELFLEET_REPORTS", "/var/tmp/r")
    assert str(report.report_path("bench", "pool a/b")) == "/var/tmp/r/bench/pool_a_b.json"


@pytest.mark.parametrize("where", ["a.json", "deep/er/a.json"])
def test_a_saved_report_is_indented_json_and_makes_its_folder(tmp_path, where):
    report.save_json(str(tmp_path / where), {"b": [1, 2], "a": "x"})
    text = (tmp_path / where).read_text()
    assert json.loads(text) == {"b": [1, 2], "a": "x"} and text.endswith("}\n") and '\n  "b"' in text
