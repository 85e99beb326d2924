"""The acceptance bench's statistics and regression flags (checks/bench.py) on hand-computed numbers."""

from modelfleet.run.checks.bench import _stats, regressions


def level(c, duration, tasks, attempts, failed, tin, tout, ttft_p99=100.0, throughput=1000.0):
    return {"concurrency": c, "duration_s": duration, "successful_tasks": tasks, "attempts": attempts,
            "failed_attempts": failed, "total_input_tokens": tin, "total_output_tokens": tout,
            "ttft": {"p99_ms": ttft_p99}, "output_throughput": throughput}


def test_stats_p99_interpolates_like_numpy_percentile():
    values = [i / 1000 for i in range(1, 101)]  # 1..100 ms; numpy.percentile(values, 99) = 99.01 ms
    assert _stats(values) == {"mean_ms": 50.5, "median_ms": 50.5, "p99_ms": 99.01}


def test_regressions_flag_worse_ttft_throughput_and_failures():
    before = {"levels": [level(4, 1, 1, 1, 0, 0, 0, ttft_p99=100.0, throughput=1000.0)]}
    now = {"levels": [level(4, 1, 1, 2, 1, 0, 0, ttft_p99=130.0, throughput=850.0)]}
    flags = regressions(now, before)
    assert len(flags) == 3 and "TTFT p99 130.0 ms vs 100.0 ms" in flags[0]
    assert regressions(before, before) == [] and regressions(now, None) == []
