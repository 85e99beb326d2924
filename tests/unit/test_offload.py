"""llama.cpp recipes that keep MoE experts in host RAM: the planner's split between GPUs and RAM (figures from the
catalog's sources: the model's parameter counts and expert mix, the unsloth quant sizes, the guides' 15 % margin),
the host setting, the recipes' lines against the real llama-server flag lists, the bench's GPU memory sampler and
preflight's RAM check."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from lab.engine_double import engine_double
from lab.engine_parsers.llama_server import option_table
from modelfleet.cli import main
from modelfleet.host.facts.host import parse_mem_total_kib
from modelfleet.plan import render
from modelfleet.plan.inventory import resolve
from modelfleet.plan.planner import (
    DENSE_GGUF_BYTES_PER_PARAM,
    FIT_TARGET_MIB,
    GIB,
    MIB,
    MIN_KV_BYTES_PER_GPU,
    expert_offload,
    plan_capacity,
    routed_expert_params,
    split_lines,
)
from modelfleet.run.checks.bench import GpuMemorySampler, gpu_memory_sh, parse_gpu_memory
from modelfleet.run.stages.preflight import host_ram_problems
from tests.helpers.recipe_pools import CATALOG, PIN, pool

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HELP_B11434 = (FIXTURES / "llama-server" / "help-b11434.txt").read_text()
K3 = CATALOG.models["kimi-k3"]
OFFLOAD = sorted(r for r in CATALOG.recipes if r.startswith("kimi-k3-llamacpp-") and r.endswith("-ram"))
# Kimi K3's catalog entry: 2.8e12 parameters, 104e9 active, 16 of 896 routed experts per token.
ROUTED = (2.8e12 - 104e9) / (1 - 16 / 896)
DENSE = (2.8e12 - ROUTED) * 34 / 32


def host(recipe: str, **extra) -> dict:
    return {"hardware": "h200", "gpu_count": 1, "model": "kimi-k3", "engine": "llama.cpp", "recipe": recipe,
            "revision": PIN, **extra}


def test_routed_expert_params_follow_from_total_active_and_the_expert_mix():
    assert routed_expert_params(K3) == pytest.approx(ROUTED)
    assert round(ROUTED / 1e9, 1) == 2745.0 and round(2.8e12 - ROUTED) == pytest.approx(54.98e9, rel=1e-3)
    assert routed_expert_params(CATALOG.models["qwen3-8b"]) == 0.0


def test_one_gpu_plus_ram_iq1_m_split():
    recipe = CATALOG.recipes["kimi-k3-llamacpp-iq1-m-1gpu-ram"]
    report = plan_capacity(K3, CATALOG.hardware["h200"], 1, recipe=recipe)
    s = report.offload
    assert report.fits and s["mode"] == "all (--cpu-moe)"
    assert s["dense_bytes"] == pytest.approx(DENSE) and DENSE_GGUF_BYTES_PER_PARAM == 34 / 32
    assert s["experts_in_ram_bytes"] == pytest.approx(649e9 - DENSE) and s["experts_on_gpus_bytes"] == 0
    assert report.weights_per_gpu_bytes == pytest.approx(DENSE * 1.15)      # 67.2 GB on the one H200
    assert s["ram_need_bytes"] == pytest.approx((649e9 - DENSE) * 1.15)      # 679.2 GB in RAM
    assert s["host_ram_gib"] == 2048
    assert report.kv_room_per_gpu_bytes == pytest.approx(143771 * MIB * 0.9 - DENSE * 1.15)
    assert split_lines(report)[2] == "in host RAM: 590.6 GB experts x 1.15 = 679.2 GB of 2048 GiB"


def test_fit_keeps_on_the_gpus_what_leaves_the_kv_floor_and_fit_target():
    recipe = CATALOG.recipes["kimi-k3-llamacpp-iq1-m-2gpu-ram"]
    assert expert_offload(recipe) == ("fit", 0)
    usable = 143771 * MIB * 0.9
    report = plan_capacity(K3, CATALOG.hardware["h200"], 2, recipe=recipe)
    on_gpus = 2 * (usable - MIN_KV_BYTES_PER_GPU - FIT_TARGET_MIB * MIB) / 1.15 - DENSE
    assert report.fits
    assert report.offload["experts_on_gpus_bytes"] == pytest.approx(on_gpus)
    assert report.offload["ram_need_bytes"] == pytest.approx((649e9 - DENSE - on_gpus) * 1.15)
    assert report.kv_room_per_gpu_bytes == pytest.approx(MIN_KV_BYTES_PER_GPU + FIT_TARGET_MIB * MIB)


def test_refused_when_gpus_and_ram_together_cannot_hold_it():
    recipe = CATALOG.recipes["kimi-k3-llamacpp-iq1-m-1gpu-ram"]
    report = plan_capacity(K3, CATALOG.hardware["h200"], 1, recipe=recipe, host_ram_gib=512)
    assert not report.fits
    assert report.reason == ("kimi-k3 needs 679.2 GB of host RAM for its experts (590.6 GB + 15%), the host has "
                             "512 GiB (549.8 GB); GPUs and RAM together offer 685.4 GB for 746.4 GB")
    q4 = CATALOG.recipes["kimi-k3-llamacpp-q4-k-xl-1gpu-ram"]
    assert plan_capacity(K3, CATALOG.hardware["h200"], 1, recipe=q4).fits  # 1.67 TB of 2 TiB
    assert not plan_capacity(K3, CATALOG.hardware["h200"], 1, recipe=q4, host_ram_gib=1024).fits


def test_a_board_without_a_ram_figure_asks_for_the_setting_and_a_small_gpu_is_still_refused():
    recipe = CATALOG.recipes["kimi-k3-llamacpp-iq1-m-1gpu-ram"]
    unset = plan_capacity(K3, CATALOG.hardware["rtx4090"], 1, recipe=recipe)
    assert not unset.fits and "set the host's `host_ram_gib`" in unset.reason
    small = plan_capacity(K3, CATALOG.hardware["rtx4090"], 1, recipe=recipe, host_ram_gib=1024)
    assert not small.fits and "67.2 GB of weights on the GPUs" in small.reason  # the dense part alone


def test_expert_offload_reads_llama_servers_own_flags():
    base = CATALOG.recipes["kimi-k3-llamacpp-iq1-m-1gpu-ram"]
    assert expert_offload(base) == ("all", 0)
    layers = base.model_copy(update={"args": ["--n-cpu-moe", "30", "--jinja"]})
    assert expert_offload(layers) == ("layers", 30)
    assert expert_offload(base.model_copy(update={"args": ["-ncmoe=12"]})) == ("layers", 12)
    assert expert_offload(CATALOG.recipes["kimi-k3-llamacpp-ud-iq1-m"]) is None
    assert expert_offload(CATALOG.recipes["kimi-k3-vllm-b300"]) is None
    # K3's catalog entry has no layer count: --n-cpu-moe cannot be sized, and says so
    report = plan_capacity(K3, CATALOG.hardware["h200"], 1, recipe=layers)
    assert not report.fits and "no layer count" in report.reason


def test_one_gpu_plus_ram_inventory_validates_renders_and_refuses_too_little_ram():
    result = resolve([("ws1", host("kimi-k3-llamacpp-iq1-m-1gpu-ram"))])
    assert result.errors == []
    plan = result.hosts["ws1"]
    assert plan.host_ram_gib == 2048  # the h200 catalog figure
    argv = render.engine_argv(plan.services[0])
    assert argv[argv.index("--n-gpu-layers"):] == ["--n-gpu-layers", "999", "--cpu-moe", "--ctx-size", "32768",
                                                   "--jinja"]
    small = resolve([("ws1", host("kimi-k3-llamacpp-iq1-m-1gpu-ram", host_ram_gib=256))])
    assert [(w, f) for w, f, _ in small.errors] == [("pool ws1", "model")]
    assert "the host has 256 GiB" in small.errors[0][2]
    bad = resolve([("ws1", host("kimi-k3-llamacpp-iq1-m-1gpu-ram", host_ram_gib=0))])
    assert [(w, f) for w, f, _ in bad.errors] == [("host ws1", "host_ram_gib")]


# Each llama.cpp recipe against the flag list of the build it names: b11434's --help (built on the H200), the lab's
# build 11669 (modelfleet/plan/catalog/engine_flags.json, generated from its --help).
LLAMA_LINES = [(r.id, r.engine_version) for r in CATALOG.recipes.values() if r.engine == "llama.cpp"]


@pytest.mark.parametrize("recipe_id,build", LLAMA_LINES, ids=[f"{r}@{b}" for r, b in LLAMA_LINES])
def test_llama_cpp_lines_parse_with_the_real_llama_server_flag_list_of_their_build(recipe_id, build, monkeypatch):
    assert build in ("b11434", "b11669")
    if build == "b11434":
        monkeypatch.setitem(engine_double.FLAGS, "llama.cpp", option_table(HELP_B11434))
    hardware = CATALOG.recipes[recipe_id].hardware[0]
    result = pool(recipe_id, hardware)
    assert result.errors == []
    argv = render.engine_argv(result.hosts["n0"].services[0])
    args = engine_double.parse_args("llama.cpp", argv)
    if recipe_id in OFFLOAD:
        assert args.get("--cpu-moe") or args.get("--fit") == "on"
    with pytest.raises(SystemExit, match="unrecognized arguments: --no-such-flag"):
        engine_double.parse_args("llama.cpp", argv + ["--no-such-flag"])


def test_the_b11434_help_names_the_offload_flags_and_fit_target_default():
    table = option_table(HELP_B11434)
    assert {"--cpu-moe": "bool", "--n-cpu-moe": "value", "--override-tensor": "value", "--fit": "value",
            "--fit-target": "value"}.items() <= table["flags"].items()
    assert table["aliases"]["-cmoe"] == "--cpu-moe" and table["aliases"]["-ncmoe"] == "--n-cpu-moe"
    assert "single value is broadcast across all devices, default: 1024" in HELP_B11434  # FIT_TARGET_MIB
    assert FIT_TARGET_MIB == 1024


def test_plan_cli_takes_the_quantization_and_prints_the_split():
    out = CliRunner().invoke(main, ["plan", "--model", "kimi-k3", "--hardware", "h200", "--gpus", "1",
                                    "--quant", "UD-IQ1_M"])
    assert out.exit_code == 0, out.output
    assert "(recipe kimi-k3-llamacpp-iq1-m-1gpu-ram)" in out.output
    assert "experts kept in host RAM: all (--cpu-moe)" in out.output
    assert "in host RAM: 590.6 GB experts x 1.15 = 679.2 GB of 2048 GiB" in out.output
    two = CliRunner().invoke(main, ["plan", "--model", "kimi-k3", "--hardware", "h200", "--gpus", "2",
                                    "--quant", "UD-IQ1_M", "--host-ram-gib", "256", "--json"])
    assert two.exit_code == 1
    data = json.loads(two.output)
    assert data["offload"]["mode"] == "what the GPUs cannot hold (--fit on)" and not data["fits"]
    wrong = CliRunner().invoke(main, ["plan", "--model", "kimi-k3", "--hardware", "h200", "--gpus", "1",
                                      "--quant", "Q9_NOPE"])
    assert wrong.exit_code == 2 and "no recipe of kimi-k3 on h200 with GGUF quantization 'Q9_NOPE'" in wrong.output
    assert "its quantizations there: UD-IQ1_M, UD-IQ1_S, UD-Q4_K_XL" in " ".join(wrong.output.split())


def test_gpu_memory_sampler_reports_peaks_per_gpu_for_the_run_and_a_window():
    # nvidia-smi's csv,noheader,nounits form (as in tests/fixtures/gpu-hosts/h200x1-ubuntu2404/nvidia-smi-query-gpu.txt)
    outputs = iter(["0, 1137\n1, 20\n", "0, 2501\n1, 22\n", "0, 2485\n1, 21\n"])
    assert gpu_memory_sh() == "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits"
    assert parse_gpu_memory("0, 2501\n1, 22\n__rc=0\n") == {0: 2501, 1: 22}
    sampler = GpuMemorySampler(lambda: next(outputs), interval_s=0.0)
    for _ in range(3):
        sampler.samples.append((len(sampler.samples), parse_gpu_memory(sampler.read())))
    assert sampler.summary() == {"samples": 3, "interval_s": 0.0, "peak_mib": {"0": 2501, "1": 22},
                                 "mean_mib": {"0": 2041.0, "1": 21.0}}
    assert sampler.summary(1, 1)["peak_mib"] == {"0": 2501, "1": 22}


def test_gpu_memory_sampler_survives_a_failing_read():
    calls = []
    sampler = GpuMemorySampler(lambda: read(), interval_s=0.0)

    def read():
        calls.append(1)
        if len(calls) == 1:
            raise OSError("ssh: connection reset")
        if len(calls) == 3:
            sampler.done.set()
        return "0, 600\n"

    sampler.run()  # the thread's loop, in this thread (the suite's process may carry gevent's patching)
    summary = sampler.summary()
    assert len(calls) == 3
    assert summary["peak_mib"] == {"0": 600} and summary["errors"] == ["OSError: ssh: connection reset"]


def test_preflight_checks_host_ram_against_meminfo():
    meminfo = (FIXTURES / "gpu-hosts" / "h200x1-ubuntu2404" / "meminfo.txt").read_text().splitlines()
    kib = parse_mem_total_kib(meminfo)
    assert kib == 131961788  # the lent H200: 125.8 GiB
    default = resolve([("ws1", host("kimi-k3-llamacpp-iq1-m-1gpu-ram"))]).hosts["ws1"]
    assert host_ram_problems(default, kib) == [
        "host RAM: /proc/meminfo says 126 GiB, the plan sized the experts in RAM against host_ram_gib 2048 GiB: "
        "set host_ram_gib to what the host has, or less"]
    inside = default.__class__(**{**default.__dict__, "host_ram_gib": 120})
    assert host_ram_problems(inside, kib) == []
    on_gpus = resolve([("ws1", {**host("kimi-k3-llamacpp-ud-iq1-m"), "gpu_count": 8})]).hosts["ws1"]
    assert host_ram_problems(on_gpus, kib) == []  # no experts in RAM: nothing to check
    assert GIB == 2**30


def test_tiny_gguf_moe_variant_has_llamas_expert_tensors_and_keeps_the_dense_file(tmp_path):
    import gguf

    from lab import tiny_gguf

    moe = gguf.GGUFReader(str(tiny_gguf.write(tmp_path / "moe.gguf", experts=8, expert_ffn=256)))
    fields = {name: field.parts[field.data[0]][0] for name, field in moe.fields.items()
              if name in ("llama.expert_count", "llama.expert_used_count", "llama.feed_forward_length")}
    assert fields == {"llama.expert_count": 8, "llama.expert_used_count": 2, "llama.feed_forward_length": 256}
    shapes = {t.name: [int(n) for n in t.shape] for t in moe.tensors if t.name.startswith("blk.0.ffn")}
    # ggml's order (innermost first), as llama.cpp's loader checks it
    assert shapes == {"blk.0.ffn_norm.weight": [64], "blk.0.ffn_gate_inp.weight": [64, 8],
                      "blk.0.ffn_gate_exps.weight": [64, 256, 8], "blk.0.ffn_up_exps.weight": [64, 256, 8],
                      "blk.0.ffn_down_exps.weight": [256, 64, 8]}
    dense = gguf.GGUFReader(str(tiny_gguf.write(tmp_path / "dense.gguf")))
    assert not [t for t in dense.tensors if "_exps" in t.name]
    # the lab's dense file is byte for byte what it was before the MoE variant existed (gguf 0.19.0)
    digest = hashlib.sha256((tmp_path / "dense.gguf").read_bytes()).hexdigest()
    assert digest == "c903ab731e59505c26de35714156c7533b66b00f21575f828822fff34ef096d6"


def test_bench_json_and_plot_carry_the_peak_per_gpu(tmp_path):
    from modelfleet.run.checks.bench import plot

    # the H200 run's record (docs/measurements/hw-runs/llama-server-h200-2026-12-03.json): a level as the bench wrote it
    record = json.loads((Path(__file__).resolve().parents[2] / "docs" / "measurements" / "hw-runs" /
                         "llama-server-h200-2026-12-03.json").read_text())
    gpu_run = record["runs"][0]
    assert gpu_run["recipe"] == "tiny-moe-h200-gpu" and gpu_run["bench"]["gpu_memory"]["peak_mib"] == {"0": 2501}
    result = {"endpoint": "@local/tiny-moe", "model": "tiny-moe", "input_len": 128, "output_len": 64,
              "levels": gpu_run["bench"]["levels"], "gpu_memory": gpu_run["bench"]["gpu_memory"]}
    plot(result, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gpu_memory_is_read_on_nvidia_hosts_only():
    from modelfleet.run.checks.bench import host_gpu_memory

    lab = resolve([("lab1", {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "llama.cpp"})])
    assert lab.errors == [] and host_gpu_memory(lab.hosts["lab1"]) is None
    local = resolve([("@local", host("kimi-k3-llamacpp-iq1-m-1gpu-ram"))]).hosts["@local"]
    assert callable(host_gpu_memory(local))


def test_the_probe_reads_memtotal_for_preflight():
    """The RAM check is fed by the one probe: its MemTotal part, on the real H200's /proc/meminfo."""
    from modelfleet.host.facts.probe import MARK, HostProbe

    meminfo = (FIXTURES / "gpu-hosts" / "h200x1-ubuntu2404" / "meminfo.txt").read_text().splitlines()
    assert "grep '^MemTotal:' /proc/meminfo" in HostProbe().command()
    lines = [f"{MARK} mem_total_kib", *[line for line in meminfo if line.startswith("MemTotal:")], f"{MARK} rc=0"]
    assert HostProbe().process(lines)["mem_total_kib"] == 131961788
