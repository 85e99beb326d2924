"""AMD admission (pure): `amd-smi metric --ecc --pcie --json` in the layout amd-smi's CLI writes (no AMD host was
recorded here: the lab persona's file follows ROCm/amdsmi's amdsmi_commands.py), amdgpu's fatal kernel lines on
public MI300X and MI50 samples, and the verdict's named checks."""

import copy
import json
from pathlib import Path

from modelfleet.host.facts.health import MARK, GpuHealth
from modelfleet.host.health import amd_verdict, parse_amd_metric, parse_amdgpu_faults
from tests.helpers.public_samples import public_sample_lines

METRIC = (Path(__file__).resolve().parents[2] / "lab" / "personas" / "mi355x8-synthetic"
          / "amd-smi-metric.json").read_text()
MEMORY = {i: 294912 for i in range(8)}



def judge(gpus, faults=(), **overrides):
    args = {"expected_count": 8, "memory_mib": MEMORY, "min_memory_mib": 294912, "min_pcie_gen": 5,
            "min_pcie_width": 16, **overrides}
    return amd_verdict(gpus, list(faults), **args)


def test_the_metric_json_is_read_wrapped_or_as_a_list_and_na_is_not_a_number():
    gpus = parse_amd_metric(METRIC)
    assert len(gpus) == 8 and gpus[7]["index"] == 7
    assert gpus[0]["pcie"] == {"width": 16, "speed_gts": 32, "gen": 5}
    assert gpus[0]["ecc"] == {"uncorrectable": 0, "deferred": 0}
    as_list = json.loads(METRIC)["gpu_data"]  # amd-smi before ROCm 6.4 printed the bare list
    assert parse_amd_metric(json.dumps(as_list)) == gpus
    as_list[0]["ecc"]["total_uncorrectable_count"] = "N/A"
    as_list[0]["pcie"]["speed"] = "N/A"
    na = parse_amd_metric(json.dumps(as_list))[0]
    assert na["ecc"]["uncorrectable"] is None and na["pcie"]["gen"] is None
    assert parse_amd_metric("ERROR:root:Unable to detect any GPU devices") is None


def test_amdgpu_fatal_lines_are_found_in_the_public_samples():
    mi300x = parse_amdgpu_faults(public_sample_lines("mi300x-dmesg-amdgpu-uncorrectable.txt"))
    assert mi300x == [{"pci": "0000:68:00.0", "text": "uncorrectable hardware error"},
                      {"pci": "0000:9e:00.0", "text": "Accelerator Check Architecture events logged"},
                      {"pci": "0000:d4:00.0", "text": "Accelerator Check Architecture events logged"}]
    assert parse_amdgpu_faults(public_sample_lines("mi50-dmesg-amdgpu-uncorrectable.txt")) == [
        {"pci": "0000:e3:00.0", "text": "uncorrectable hardware error"}]
    assert parse_amdgpu_faults(["[ 1.0] amdgpu 0000:05:00.0: amdgpu: MEM ECC is active."]) == []


def test_a_healthy_board_is_admitted_and_each_fault_refused_by_name():
    healthy = parse_amd_metric(METRIC)
    assert judge(healthy)["ok"], judge(healthy)["reasons"]
    cases = {"ecc_uncorrectable": ("ecc", "uncorrectable", 2), "ecc_deferred": ("ecc", "deferred", 1),
             "pcie_width": ("pcie", "width", 8), "pcie_gen": ("pcie", "gen", 4)}
    for check, (group, key, value) in cases.items():
        gpus = copy.deepcopy(healthy)
        gpus[3][group][key] = value
        report = judge(gpus)
        assert not report["ok"] and [c["check"] for c in report["checks"] if not c["ok"]] == [check], check
        assert report["reasons"][0].startswith("GPU 3: ")
    short = judge(healthy[:7])
    assert [c["check"] for c in short["checks"] if not c["ok"]] == ["gpu_count"]
    small = judge(healthy, memory_mib={**MEMORY, 2: 196608})
    assert small["reasons"] == ["GPU 2 reports 196608 MiB, the board has 294912 MiB"]


def test_a_fatal_kernel_line_refuses_the_host_naming_the_gpu_address():
    faults = parse_amdgpu_faults(public_sample_lines("mi300x-dmesg-amdgpu-uncorrectable.txt"))[:1]
    report = judge(parse_amd_metric(METRIC), faults)
    assert not report["ok"]
    assert report["reasons"] == ["0000:68:00.0 since boot: RAS uncorrectable error (the driver resets the GPU) "
                                 "('uncorrectable hardware error')"]


def test_links_are_not_judged_where_the_catalog_has_no_threshold():
    gpus = parse_amd_metric(METRIC)
    gpus[0]["pcie"]["width"] = 8
    assert judge(gpus, min_pcie_gen=None, min_pcie_width=None)["ok"]


def test_the_health_read_carries_amd_smi_and_the_amdgpu_lines():
    output = [f"{MARK} smi", f"{MARK} nvlink", f"{MARK} amd", *METRIC.splitlines(), f"{MARK} kernel",
              *public_sample_lines("mi50-dmesg-amdgpu-uncorrectable.txt")[2:3], f"{MARK} id", "6.8.0", "boot-1"]
    health = GpuHealth().process(output)
    assert health["gpus"] is None and len(health["amd_gpus"]) == 8
    assert health["amdgpu_faults"] == [{"pci": "0000:e3:00.0", "text": "uncorrectable hardware error"}]
    assert "amd-smi metric --ecc --pcie --json" in GpuHealth().command()


def test_the_remote_grep_keeps_every_line_the_parsers_read():
    import subprocess

    from modelfleet.host.health import KERNEL_LOG_PATTERN
    lines = (public_sample_lines("mi300x-dmesg-amdgpu-uncorrectable.txt")
             + public_sample_lines("mi50-dmesg-amdgpu-uncorrectable.txt"))
    lines.append("Dec 03 10:12:44 h200 kernel: NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, "
                 "GPU has fallen off the bus.")
    kept = subprocess.run(["grep", "-E", KERNEL_LOG_PATTERN], input="\n".join(lines), capture_output=True,
                          text=True).stdout.splitlines()
    assert parse_amdgpu_faults(kept) == parse_amdgpu_faults(lines) and len(parse_amdgpu_faults(kept)) == 4
    assert any("NVRM: Xid" in line for line in kept) and len(kept) == 5
