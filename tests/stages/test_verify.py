"""Stage verify: one gate per pool at its head (a worker has no endpoint), the failures of a report as the
lines a refused host shows, and what it reads to know whether a pool (re)starts."""

import pytest

from modelfleet.inventory import resolve
from modelfleet.pipeline import run_stages
from modelfleet.stages import verify
from modelfleet.units import start_reads

POOL = {"hardware": "h200", "gpu_count": 1, "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm-dp2", "pool": "pair",
        "revision": "e" * 40, "image": "vllm/vllm-openai:v0.34.0@sha256:" + "f" * 64}


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
