"""The pool gate's verdict (netcheck.judge): every member must report, pass, and clear the threshold."""

from modelfleet.run.stages.netcheck import judge


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


# The lent H200's own figures (docs/measurements/hw-runs/h2d-h200x1-2026-12-03.json): 54.04 GB/s in, 54.98 GB/s out.
H200_COPIES = [{"gpu": 0, "bytes": 1 << 30, "h2d_gbs": 54.04, "d2h_gbs": 54.98}]


def test_copy_bandwidth_is_judged_for_the_hosts_that_asked_against_the_catalog_figure():
    slow = [{**H200_COPIES[0], "gpu": 1, "h2d_gbs": 21.3}]  # e.g. a link trained down to Gen4 x8
    reports = {"a": {**report(400.0), "h2d": H200_COPIES}, "b": {**report(400.0), "h2d": H200_COPIES + slow}}
    verdict = judge("k3", ["a", "b"], reports, minimum=350.0, h2d_asked=("a", "b"), h2d_minimum=48.0)
    assert not verdict["ok"] and verdict["h2d_threshold_gbps"] == 48.0
    assert verdict["problems"] == ["b: GPU 1 copies host-to-device at 21.3 GB/s and device-to-host at 54.98 GB/s, "
                                   "< 48.0 GB/s required"]
    assert verdict["per_host"]["a"]["h2d"] == H200_COPIES


def test_a_one_gpu_pool_is_judged_on_its_copies_alone_and_missing_figures_fail_it():
    alone = {"ok": True, "exit_ok": True, "results": [], "world_size": 1, "h2d": H200_COPIES}
    assert judge("one", ["a"], {"a": alone}, minimum=None, h2d_asked=("a",), h2d_minimum=48.0)["ok"]
    silent = {**alone, "h2d": None}
    verdict = judge("one", ["a"], {"a": silent}, minimum=None, h2d_asked=("a",), h2d_minimum=48.0)
    assert verdict["problems"] == ["a: no host-to-device figures (the check script did not measure them)"]


def test_the_check_command_asks_for_copies_and_skips_collectives_on_one_gpu():
    from modelfleet.plan.inventory import resolve
    from modelfleet.run.stages.netcheck import check_command

    one = {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm", "pool": "p"}
    svc = resolve([("a", one)]).hosts["a"].services[0]
    command = check_command(svc, "img@sha256:" + "0" * 64, h2d=True)
    assert "--ops '' " in command and "--h2d-bytes 1G" in command
    assert "--h2d-bytes" not in check_command(svc, "img@sha256:" + "0" * 64)


def test_the_check_container_on_the_hosts_network_cannot_change_its_uid():
    """Beside a front door whose worker-API rule knows users by uid, the gate's container (host network, the
    serving image) runs as the engine's does: no CAP_SETUID/CAP_SETGID, no new privileges."""
    from modelfleet.plan.inventory import resolve
    from modelfleet.run.stages.netcheck import check_command

    one = {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm", "pool": "p"}
    command = check_command(resolve([("a", one)]).hosts["a"].services[0], "img@sha256:" + "0" * 64)
    assert "--network host" in command
    assert "--cap-drop SETUID --cap-drop SETGID --security-opt no-new-privileges" in command
