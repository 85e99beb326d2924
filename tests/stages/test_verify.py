"""Stage verify: one gate per pool at its head (a worker has no endpoint), the failures of a report as the
lines a refused host shows, and what it reads to know whether a pool (re)starts."""

import pytest

from modelfleet.host.units import start_reads
from modelfleet.plan.inventory import resolve
from modelfleet.run.pipeline import run_stages
from modelfleet.run.stages import verify

POOL = {"hardware": "h200", "gpu_count": 1, "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm-dp2",
        "pool": "pair", "revision": "e" * 40, "image": "vllm/vllm-openai:v0.34.0@sha256:" + "f" * 64}


@pytest.fixture(autouse=True)
def reports(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))


def test_a_pool_is_verified_at_its_head_only(fake):
    hosts = [("a", {**POOL, "ssh_hostname": "192.0.2.1"}), ("b", {**POOL, "ssh_hostname": "192.0.2.2"})]
    state = fake.run_fake(hosts, lambda: run_stages(verify), dry=True)
    ops = {name: [sorted(state.get_op_meta(h).names)[0] for h in state.get_op_order()
                  if h in state.ops[state.inventory.get_host(f"@fake/{name}")]] for name in "ab"}
    assert [op for op in ops["a"] if op.startswith("modelfleet verify | Verify ")] and \
        not [op for op in ops["b"] if op.startswith("modelfleet verify | Verify ")], ops


def test_a_verified_pool_stamps_its_first_answer_on_the_runs_timeline(fake, monkeypatch):
    """The gate says when the pool first answered (the timeline reads no operation's wording)."""
    from modelfleet.run import timeline

    monkeypatch.setattr(verify, "run_gate", lambda *a, **k: {"ok": True, "readiness": {"ok": True}})
    monkeypatch.setattr(verify.exposure, "check", lambda target: {"ok": True})
    monkeypatch.setattr(verify, "reachable_from_control_node", lambda plan, svc: True)  # no SSH to tunnel through
    host = {**POOL, "recipe": "tiny-lab-vllm", "ssh_hostname": "192.0.2.1"}
    state = fake.run_fake([("a", host)], lambda: run_stages(verify))
    member = timeline.recorder(state).pools["pair"]["@fake/a"]
    assert member["first_answer"] > timeline.recorder(state).started


def test_a_failed_report_reads_as_one_line_per_failure():
    report = {"scope": "full", "bench": {"regressions": ["ttft_p50 1.9x the baseline"]},
              "readiness": {"ok": True}, "smoke": {"ok": False, "failures": ["no reasoning_content"]},
              "tool_probe": {"ok": False, "error": "HTTP 500"}}
    assert verify._failures(report) == ["bench: ttft_p50 1.9x the baseline", "smoke: no reasoning_content",
                                        "tool_probe: HTTP 500"]
    assert verify._failures({"scope": "readiness", "readiness": {"ok": False}}) == ["readiness: not run"]


def test_it_declares_what_deciding_a_pool_restart_reads():
    plan = resolve([("a", POOL)]).hosts["a"]
    assert verify.wants(plan, {}) == start_reads(plan)
    assert verify.wants(plan, {})["units"] == [plan.services[0].unit_name]


def test_the_restart_tier_fallback_is_read_from_the_engines_lines_and_named(fake, monkeypatch, caplog, tmp_path):
    # vLLM's weight cache falls back to the disk load without failing: the gate reads the engine's own lines.
    import json

    from modelfleet.host.operations.report import report_path
    from tests.helpers.fake_hosts import b300_host
    from tests.unit.test_weight_cache import VLLM_FALLBACK, VLLM_LOADED, VLLM_MAPPED

    monkeypatch.setattr(verify, "endpoint_verified", lambda **kwargs: None)  # no endpoint behind @fake
    caplog.set_level("INFO")
    stamp = "2026-12-05T03:10:02.000000000Z "

    def run(lines):
        host = {**b300_host(), "weight_cache": True,
                "fake_responses": {"docker logs --timestamps": [stamp + line for line in lines]}}
        return fake.run_fake([("b300-01", host)], lambda: run_stages(verify))

    run([VLLM_FALLBACK, VLLM_LOADED])
    assert ("modelfleet: weight cache fallback: k31 on @fake/b300-01 fell back to loading from disk (no daemon at "
            "/run/modelfleet-weights/x.sock): the restart tier did not serve this start (journalctl -u "
            "modelfleet-k31-weights.service)") in caplog.text
    report = json.loads(report_path("weight_load", "k31-@fake/b300-01").read_text())
    assert report == {"host": "@fake/b300-01", "weight_load": "fallback",
                      "why": "no daemon at /run/modelfleet-weights/x.sock"}
    caplog.clear()
    run([VLLM_MAPPED])
    assert "weight cache fallback" not in caplog.text and "mapped 1822 tensors from the weight cache" in caplog.text
    assert json.loads(report_path("weight_load", "k31-@fake/b300-01").read_text())["weight_load"] == "mapped"
    run([VLLM_LOADED])
    assert "modelfleet: weight cache disk: k31 on @fake/b300-01 loaded from disk without asking" in caplog.text
