"""reports/timeline/<pool>.json from a run through pyinfra's @fake connector: the stages' spans, the wait until the
endpoint answers, and the engine's boot lines read from its container (a verbatim public vLLM log)."""

import json
from pathlib import Path

import pytest
from pyinfra.api.connect import disconnect_all  # noqa: E402

from modelfleet.plan.inventory import resolve  # noqa: E402
from tests.helpers.fake_hosts import b300_host, b300_probe, converged_replies, serve  # noqa: E402

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "engine-logs"


@pytest.fixture(autouse=True)
def reports(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    return tmp_path


def test_a_started_engine_gets_a_timeline_with_its_boot(fake, reports):
    log = (LOGS / "vllm-warm-graph-capture-glm-v-204.txt").read_text().split("# ---\n", 1)[1].splitlines()
    host = {**b300_host(), "fake_responses": {"@@modelfleet-probe": b300_probe(fake), "docker logs --timestamps": log}}
    state = fake.run_fake([("b300-01", host)], serve)
    assert any(c.startswith("sh -c 'docker logs --timestamps modelfleet-k31--fake-b300-01 2>&1") for c in
               fake.executed(state, "b300-01"))
    report = json.loads((reports / "timeline" / "k31.json").read_text())
    member = report["hosts"]["@fake/b300-01"]
    stages = [s["stage"] for s in member["stages"]]
    assert stages == ["prepare", "images", "service"]  # preflight only reads facts: in prepare
    for span in member["stages"]:
        assert 0 <= span["start_s"] <= span["end_s"] and span["seconds"] >= 0
    service = next(s for s in member["stages"] if s["stage"] == "service")
    assert service["start_s"] <= member["ready_s"] <= service["end_s"]
    assert report["ready_s"] == member["ready_s"] and member["first_answer_s"] is None  # no verify stage here
    assert member["engine_boot"]["compile_cache"] == "warm"
    assert member["engine_boot"]["summary"]["graphs_captured"] == 7.0


def test_a_dry_run_writes_no_timeline(fake, reports):
    host = {**b300_host(), "fake_responses": {"@@modelfleet-probe": b300_probe(fake)}}
    state = fake.run_fake([("b300-01", host)], serve, dry=True)
    disconnect_all(state)
    assert not (reports / "timeline").exists()


def test_a_converged_run_keeps_the_last_timeline(fake, reports):
    svc = resolve([("@fake/b300-01", b300_host())]).hosts["@fake/b300-01"].services[0]
    fake.run_fake([("b300-01", {**b300_host(), "fake_responses": converged_replies(fake, svc)})], serve)
    assert not (reports / "timeline").exists()
