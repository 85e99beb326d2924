"""The verify gate's client work (checks/gate.py): readiness asked in this process, the full check (smoke, tool
probe, exposure) in a child interpreter that gets the endpoint on stdin and answers one JSON report, and a child
that fails said as a failed readiness, not a crash of the run. Against the lab's engine double on loopback."""

from __future__ import annotations

import pytest

from modelfleet.run.checks import Endpoint, gate
from tests.helpers.engine_on_loopback import engine_on_loopback

pytestmark = pytest.mark.slow  # the gate in its child interpreter

KEY = "k-gate-test"


def endpoint(url: str, key: str | None = KEY) -> Endpoint:
    return Endpoint(name="h/p", base_url=url, model="tiny-lab", engine="sglang", api_key=key)


def test_readiness_alone_is_asked_here_without_a_child(monkeypatch, tmp_path):
    with engine_on_loopback(monkeypatch, "sglang", key=KEY) as url:
        report = gate.run_gate(endpoint(url), ready_timeout_s=2, full=False, bench=None, bench_dir=tmp_path)
    assert report["ok"] and report["scope"] == "readiness" and report["readiness"]["models"] == ["tiny-lab"]
    assert "smoke" not in report


def test_the_full_gate_comes_back_from_the_child_as_one_report(monkeypatch, tmp_path):
    with engine_on_loopback(monkeypatch, "sglang", key=KEY) as url:
        report = gate.run_gate(endpoint(url), ready_timeout_s=2, full=True, bench=None, bench_dir=tmp_path)
    assert report["ok"] and report["scope"] == "full", report
    assert report["smoke"]["ok"] and report["tool_probe"]["arguments"] == {"city": "Paris"}
    assert report["exposure"]["ok"]  # the key reached the child (on stdin) and the child asked without it


def test_a_child_that_fails_is_a_failed_readiness_with_its_last_error_line(monkeypatch, tmp_path):
    bench = {"levels_that_do_not_exist": [1]}  # bench() takes no such argument: the child dies of a TypeError
    with engine_on_loopback(monkeypatch, "sglang", key=KEY) as url:
        report = gate.run_gate(endpoint(url), ready_timeout_s=2, full=False, bench=bench, bench_dir=tmp_path)
    assert report == {"ok": False, "readiness": {"ok": False, "error": report["readiness"]["error"]}}
    error = report["readiness"]["error"]
    assert error.startswith("the check process failed: TypeError: ") and "levels_that_do_not_exist" in error
