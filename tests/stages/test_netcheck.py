"""The pool gate's verdict (netcheck.judge): every member must report, pass, and clear the threshold."""

from modelfleet.stages.netcheck import judge


def report(busbw: float, ok: bool = True) -> dict:
    results = [{"op": "all_reduce", "bytes": b, "time_us": 10.0, "algbw_gbs": busbw / 2, "busbw_gbs": bw}
               for b, bw in ((1 << 20, busbw / 4), (1 << 30, busbw))]
    return {"ok": ok, "exit_ok": ok, "results": results, "nccl_version": "2.27.3", "world_size": 16}


def test_a_pool_passes_when_every_member_clears_the_threshold_at_the_largest_size():
    verdict = judge("k3", ["a", "b"], {"a": report(400.0), "b": report(380.0)}, minimum=350.0)
    assert verdict["ok"] and verdict["per_host"]["b"]["busbw_gbps_at_largest"] == 380.0


def test_a_slow_a_failed_and_a_silent_member_each_fail_the_pool_with_its_name():
    failed = {**report(400.0, ok=False), "error": "NCCL WARN socket timeout"}
    verdict = judge("k3", ["a", "b", "c"], {"a": report(100.0), "b": failed}, minimum=350.0)
    assert not verdict["ok"]
    assert verdict["problems"] == ["a: all_reduce busbw 100.0 GB/s at 1073741824 B < 350.0 GB/s required",
                                   "b: NCCL WARN socket timeout", "c: no result (the check did not run there)"]


def test_without_a_known_threshold_only_correctness_is_judged_and_the_report_says_so():
    verdict = judge("k3", ["a"], {"a": report(1.0)}, minimum=None)
    assert verdict["ok"] and verdict["threshold_note"] == "no threshold known: correctness only"
