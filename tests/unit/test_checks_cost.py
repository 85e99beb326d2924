"""Cost per successful task (checks/cost.py) on hand-computed numbers: a self-hosted hour and an API's tokens,
and a price file that says neither, or says it with a negative number, refused naming the field."""

import pytest
import yaml

from modelfleet.run.checks.cost import PriceError, cost_per_task, load_prices


def level(c, duration, tasks, attempts, failed, tin, tout, ttft_p99=100.0, throughput=1000.0):
    return {"concurrency": c, "duration_s": duration, "successful_tasks": tasks, "attempts": attempts,
            "failed_attempts": failed, "total_input_tokens": tin, "total_output_tokens": tout,
            "ttft": {"p99_ms": ttft_p99}, "output_throughput": throughput}


BENCH = {"endpoint": "b300-01/k31", "model": "kimi-local",
         "levels": [level(1, 1800, 100, 104, 4, 200_000, 300_000), level(8, 1800, 40, 40, 0, 80_000, 100_000)]}


def test_self_hosted_cost_per_successful_task_matches_the_hand_computation(tmp_path):
    prices = tmp_path / "p.yaml"
    prices.write_text(yaml.safe_dump({"compute": {"gpu_hour_usd": 6.5, "gpus": 8}, "storage_network_usd": 0.4,
                                      "operations_usd": 1.0, "human_correction_usd": 2.6}))
    result = cost_per_task(BENCH, load_prices(prices))
    # 1 h x 8 GPUs x $6.5 = $52; + 0.4 + 1.0 + 2.6 = $56; 140 unique completed tasks -> $0.40 per task.
    assert result["compute_or_api_usd"] == 52.0 and result["total_usd"] == 56.0
    assert result["successful_tasks"] == 140 and result["cost_per_successful_task_usd"] == 0.4
    assert result["attempts"] == 144 and result["failed_attempts"] == 4  # counted in the hour, not the divisor


def test_api_cost_counts_every_attempt_once():
    prices = {"api": {"input_per_mtok_usd": 0.6, "output_per_mtok_usd": 2.5}}
    result = cost_per_task(BENCH, prices)
    # 280k input x 0.6/M = 0.168; 400k output x 2.5/M = 1.0 -> 1.168 / 140 tasks
    assert result["compute_or_api_usd"] == pytest.approx(1.168)
    assert result["cost_per_successful_task_usd"] == pytest.approx(1.168 / 140, abs=1e-6)


def test_prices_must_say_compute_or_api_and_numbers(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("storage_network_usd: 1\n")
    with pytest.raises(PriceError, match="exactly one of"):
        load_prices(bad)
    bad.write_text("compute: {gpu_hour_usd: -1, gpus: 8}\n")
    with pytest.raises(PriceError, match="compute.gpu_hour_usd"):
        load_prices(bad)
