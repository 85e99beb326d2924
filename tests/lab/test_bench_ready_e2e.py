"""`make bench-ready` in one round on two hosts added to the session's lab: the JSON it prints has the three cases,
each split into stages that fit in its time to the first answer, the join's checkpoint from the peer, not the hub."""

import json

import pytest

import lab
from lab import bench_ready

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def two_fresh_hosts(lab_hosts):
    personas = [s["persona"] for s in lab_hosts] + ["h200x1"] * bench_ready.HOSTS
    specs = lab.up(len(personas), personas=personas, disks=1)[-bench_ready.HOSTS:]  # the session's keep their disks
    yield specs
    lab.remove([s["name"] for s in specs])


def test_one_round_times_cold_restart_and_join_by_stage(two_fresh_hosts, tmp_path):
    rounds = [bench_ready.measure(two_fresh_hosts, tmp_path)]
    printed = json.loads(json.dumps(bench_ready.summary(rounds)))
    assert set(printed) == {*bench_ready.CASES, "ratios"}
    for case in bench_ready.CASES:
        figures = printed[case]
        assert 0 < figures["ready_s"] <= figures["first_answer_s"] <= figures["pyinfra_wall_s"], (case, figures)
        assert {"prepare", "service", "verify"} <= set(figures["stages_s"]), (case, figures)
        # Stage spans do not overlap on one host: together they fit in the time to the first answer.
        assert sum(figures["stages_s"].values()) <= figures["first_answer_s"] + 0.01, (case, figures)
        assert figures["between_stages_s"] >= -0.01, (case, figures)
        # The real llama-server's boot lines were read after each (re)start, and its boot fits in the service's.
        boot = rounds[0][case]["engine_boot_at_s"]
        assert {"weights_begin", "model_loaded", "api_server_started"} <= set(boot), (case, boot)
        assert 0 <= figures["engine_log_span_s"] <= figures["service_to_ready_s"] <= figures["stages_s"]["service"]
    assert printed["cold"]["hub_bytes_served"] > 0
    assert printed["restart"]["hub_bytes_served"] == 0 and printed["join"]["hub_bytes_served"] == 0
    assert printed["ratios"]["restart_over_cold"] == round(
        printed["restart"]["first_answer_s"] / printed["cold"]["first_answer_s"], 3)
    # The recipe's budgets beside what this round measured, each judged on its own median.
    held = bench_ready.budget(printed)
    for case in ("cold", "restart"):
        assert held[case]["ready_s"] == printed[case]["ready_s"]
        assert held[case]["over"] == (printed[case]["ready_s"] > held[case]["budget_s"])
    assert held["restart"]["budget_s"] < held["cold"]["budget_s"]
