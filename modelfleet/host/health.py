"""GPU admission (pure): what `nvidia-smi -q -x` and the kernel log say about each GPU, and the verdict on
whether the host may join a pool. Every check has a name, the value seen and the threshold it was held to.

An Xid seen since boot counts by NVIDIA's own action for it (modelfleet/plan/xids.py: the Xid catalog as data).
"""

from __future__ import annotations

import json
import re
import time
import xml.etree.ElementTree as ET

from modelfleet.host.operations.report import report_path
from modelfleet.plan import nvlink_errors as nvlink_counters
from modelfleet.plan import xids as xid_catalog

# Clock event reasons that mean the hardware is slowing the GPU down (idle, application clocks and the
# software power cap are normal).
SLOWDOWN_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")
NVLINK_LINK = re.compile(r"^\s+Link (\d+): (.*)$")
XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+),?\s*(.*)")
# A GPU off the bus reported without an Xid line (public samples: NVSentinel issue #155, driver 570, in three
# lines "NVRM: The NVIDIA GPU <pci>" ... "fallen off the bus"; older drivers in one, "NVRM: GPU at <pci> has
# fallen off the bus"): counted as Xid 79, as NVSentinel and leptonai/gpud do.
OFF_BUS_GPU = re.compile(r"NVRM: (?:The NVIDIA GPU|GPU at) ([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.\d)")
OFF_BUS = "fallen off the bus"
# amdgpu's fatal kernel messages, as MI300X hosts print them (ROCm/legacy-rocm-build issue #4021, in
# tests/fixtures/public-samples/mi300x-dmesg-amdgpu-uncorrectable.txt): an uncorrectable error raised by RAS
# (amdgpu_ras.c: the GPU is reset) and the machine-check architecture's record of it.
AMDGPU_FATAL = {
    "uncorrectable hardware error": "RAS uncorrectable error (the driver resets the GPU)",
    "Accelerator Check Architecture events logged": "hardware error recorded by the accelerator check architecture",
}
AMDGPU_LINE = re.compile(r"amdgpu ([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.\d): .*?("
                         + "|".join(re.escape(k) for k in AMDGPU_FATAL) + ")")
# grep -E: the lines both vendors' reads keep
KERNEL_LOG_PATTERN = ("NVRM: (Xid|The NVIDIA GPU|GPU at)|" + OFF_BUS + "|amdgpu .*(" + "|".join(AMDGPU_FATAL) + ")")
# PCIe transfer rate (GT/s) per generation, as amd-smi reports a link's speed
PCIE_GEN_OF_GTS = {2.5: 1, 5: 2, 8: 3, 16: 4, 32: 5, 64: 6}


def _text(node, path: str) -> str | None:
    found = node.find(path)
    return found.text.strip() if found is not None and found.text else None


def _int(value: str | None) -> int | None:
    match = re.match(r"\s*(\d+)", value or "")
    return int(match.group(1)) if match else None


def parse_smi_xml(text: str) -> list[dict]:
    """One dict per GPU from `nvidia-smi -q -x` (the fields admission judges; N/A becomes None)."""
    return gpus_of(ET.fromstring(text))


def gpus_of(root: ET.Element) -> list[dict]:
    gpus = []
    for gpu in root.findall("gpu"):
        link = "pci/pci_gpu_link_info"
        reasons = gpu.find("clocks_event_reasons")
        if reasons is None:  # drivers before R535 call them throttle reasons
            reasons = gpu.find("clocks_throttle_reasons")
        active = []
        if reasons is not None:
            for child in reasons:
                name = child.tag.replace("clocks_event_reason_", "").replace("clocks_throttle_reason_", "")
                if (child.text or "").strip() == "Active":
                    active.append(name)
        gpus.append({
            "index": _int(_text(gpu, "minor_number")),
            "uuid": _text(gpu, "uuid"), "serial": _text(gpu, "serial"), "bus_id": _text(gpu, "pci/pci_bus_id"),
            "name": _text(gpu, "product_name"),
            "persistence_mode": _text(gpu, "persistence_mode"),
            "memory_total_mib": _int(_text(gpu, "fb_memory_usage/total")),
            "pcie": {"gen": _int(_text(gpu, f"{link}/pcie_gen/current_link_gen")),
                     "max_gen": _int(_text(gpu, f"{link}/pcie_gen/max_link_gen")),
                     "width": _int(_text(gpu, f"{link}/link_widths/current_link_width")),
                     "max_width": _int(_text(gpu, f"{link}/link_widths/max_link_width"))},
            "ecc": {"volatile_uncorrectable": sum(_int(_text(gpu, f"ecc_errors/volatile/{k}")) or 0 for k in (
                        "dram_uncorrectable", "sram_uncorrectable", "sram_uncorrectable_parity",
                        "sram_uncorrectable_secded")),
                    "aggregate_uncorrectable": sum(_int(_text(gpu, f"ecc_errors/aggregate/{k}")) or 0 for k in (
                        "dram_uncorrectable", "sram_uncorrectable", "sram_uncorrectable_parity",
                        "sram_uncorrectable_secded"))},
            "retired_pending": _text(gpu, "retired_pages/pending_retirement"),
            "remapped": {"pending": _text(gpu, "remapped_rows/remapped_row_pending"),
                         "failure": _text(gpu, "remapped_rows/remapped_row_failure")},
            "clock_events": active,
            "fabric": {"state": _text(gpu, "fabric/state"), "status": _text(gpu, "fabric/status")},
        })
    return gpus


def parse_xids(lines: list[str]) -> list[dict]:
    """Xid events from kernel log lines (`NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off ...`), and
    a GPU reported off the bus without an Xid line as Xid 79 (once per GPU and report)."""
    out, gpu = [], None
    for line in lines:
        match = XID_LINE.search(line)
        if match:
            out.append({"pci": match.group(1).lower(), "xid": int(match.group(2)), "text": match.group(3).strip()})
            continue
        named = OFF_BUS_GPU.search(line)
        gpu = named.group(1).lower() if named else gpu
        if OFF_BUS in line and gpu and not any(e["pci"] == gpu and e["xid"] == 79 for e in out):
            out.append({"pci": gpu, "xid": 79, "text": "GPU has fallen off the bus (reported without an Xid line)"})
    return out


def parse_nvlink(lines: list[str]) -> dict[int, dict]:
    """`nvidia-smi nvlink -s`: {gpu index: {"links": n, "inactive": [link numbers]}}. A link prints its speed
    ("Link 0: 26.562 GB/s") or `<inactive>`; a GPU with no NVLink prints no links (then it is absent here)."""
    out: dict[int, dict] = {}
    for gpu, link in nvlink_counters.gpu_lines(lines, NVLINK_LINK):
        entry = out.setdefault(gpu, {"links": 0, "inactive": []})
        entry["links"] += 1
        if "inactive" in link.group(2).lower():
            entry["inactive"].append(int(link.group(1)))
    return out


def parse_amd_metric(text: str) -> list[dict] | None:
    """One dict per GPU from `amd-smi metric --ecc --pcie --json` (its keys as amdsmi_cli/amdsmi_commands.py
    writes them: ecc.total_uncorrectable_count / total_deferred_count, pcie.width, pcie.speed {value, unit
    GT/s}; "N/A" becomes None); None when amd-smi printed no JSON. Newer amd-smi wraps the list in gpu_data."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if isinstance(data, dict):
        data = data.get("gpu_data", [])

    def number(value):
        value = value.get("value") if isinstance(value, dict) else value
        return value if isinstance(value, (int, float)) else None

    gpus = []
    for item in data:
        ecc, pcie = item.get("ecc") or {}, item.get("pcie") or {}
        speed = number(pcie.get("speed"))
        gpus.append({"index": int(item.get("gpu", len(gpus))),
                     "ecc": {"uncorrectable": number(ecc.get("total_uncorrectable_count")),
                             "deferred": number(ecc.get("total_deferred_count"))},
                     "pcie": {"width": number(pcie.get("width")), "speed_gts": speed,
                              "gen": PCIE_GEN_OF_GTS.get(speed)}})
    return gpus


def parse_amdgpu_faults(lines: list[str]) -> list[dict]:
    """amdgpu's fatal kernel messages (AMDGPU_FATAL) from kernel log lines, with the GPU's PCI address."""
    return [{"pci": m.group(1).lower(), "text": m.group(2)} for m in map(AMDGPU_LINE.search, lines) if m]


def amd_verdict(gpus: list[dict], faults: list[dict], expected_count: int, memory_mib: dict[int, int],
                min_memory_mib: int, min_pcie_gen: int | None, min_pcie_width: int | None) -> dict:
    """AMD's checks, named as NVIDIA's where they mean the same: GPU count, memory (amd-smi static, from
    preflight's probe), uncorrectable and deferred ECC errors, PCIe link against the board's, and amdgpu's fatal
    kernel messages since boot. A value amd-smi reports as N/A is not judged."""
    checks = [_check("gpu_count", None, len(gpus), expected_count, len(gpus) >= expected_count,
                     f"{len(gpus)} GPU(s) answer, the inventory expects {expected_count}")]
    for gpu in gpus:
        i, ecc, pcie = gpu["index"], gpu["ecc"], gpu["pcie"]
        mem = memory_mib.get(i) or 0
        checks.append(_check("memory", i, mem, min_memory_mib, mem >= min_memory_mib,
                             f"GPU {i} reports {mem} MiB, the board has {min_memory_mib} MiB"))
        if ecc["uncorrectable"] is not None:
            checks.append(_check("ecc_uncorrectable", i, ecc["uncorrectable"], 0, ecc["uncorrectable"] == 0,
                                 f"GPU {i}: {ecc['uncorrectable']} uncorrectable ECC error(s)"))
        if ecc["deferred"] is not None:
            checks.append(_check("ecc_deferred", i, ecc["deferred"], 0, ecc["deferred"] == 0,
                                 f"GPU {i}: {ecc['deferred']} deferred (poisoned) ECC error(s)"))
        if min_pcie_gen and pcie["gen"] is not None:
            checks.append(_check("pcie_gen", i, pcie["gen"], min_pcie_gen, pcie["gen"] >= min_pcie_gen,
                                 f"GPU {i}: PCIe link at {pcie['speed_gts']} GT/s (Gen{pcie['gen']}), the board "
                                 f"runs Gen{min_pcie_gen}"))
        if min_pcie_width and pcie["width"] is not None:
            checks.append(_check("pcie_width", i, pcie["width"], min_pcie_width, pcie["width"] >= min_pcie_width,
                                 f"GPU {i}: PCIe link trained at x{pcie['width']}, the board runs x{min_pcie_width}"))
    for fault in faults:
        checks.append(_check("amdgpu_fault", fault["pci"], fault["text"], "none", False,
                             f"{fault['pci']} since boot: {AMDGPU_FATAL[fault['text']]} ('{fault['text']}')"))
    return {"ok": all(c["ok"] for c in checks), "checks": checks,
            "reasons": [c["reason"] for c in checks if not c["ok"]]}


def parse_dcgm_diag(text: str) -> dict | None:
    """`dcgmi diag -r N -j`: each test's name, category and status (pass, skip, warn, fail, not run), its
    failures' warnings, and DCGM's runtime error; None when dcgmi printed no JSON (e.g. no nv-hostengine).
    DCGM 4 writes "DCGM Diagnostic" with a test_summary per test and results per entity (NVIDIA/DCGM
    testing/python3/dcgm_diag_schema.json, dcgmi/Diag.cpp's Pass/Skip/Warn/Fail/Not Run); DCGM 3 wrote
    "DCGM GPU Diagnostic" with results per GPU group (PASS/FAIL/SKIP). Text before the JSON is skipped."""
    start = text.find("{")
    try:
        data, _ = json.JSONDecoder().raw_decode(text[start:]) if start >= 0 else (None, 0)
    except ValueError:
        return None
    root = data.get("DCGM Diagnostic") or data.get("DCGM GPU Diagnostic") if isinstance(data, dict) else None
    if not isinstance(root, dict):
        return None
    tests = []
    for category in root.get("test_categories") or []:
        for test in (category or {}).get("tests") or []:
            if not test:
                continue
            results = test.get("results") or []
            statuses = [str(r.get("status", "")).lower() for r in results]
            summary = str((test.get("test_summary") or {}).get("status", "")).lower()
            status = summary or next((s for s in ("fail", "warn", "not run", "pass", "skip") if s in statuses), "")
            warnings = [w.get("warning", "") if isinstance(w, dict) else str(w)
                        for r in results if str(r.get("status", "")).lower() == "fail"
                        for w in r.get("warnings") or []]
            tests.append({"name": test.get("name"), "category": category.get("category"), "status": status,
                          "warnings": warnings})
    return {"tests": tests, "runtime_error": root.get("runtime_error") or data.get("runtime_error")}


def dcgm_check(level: int, output: str, missing: bool) -> dict:
    """The `dcgm_diag` check: refused when dcgmi is absent, printed no JSON, reported a runtime error, passed no
    test at all (every test skipped or not run proves nothing), or a test failed (a warning or a skip beside
    passing tests passes, as DCGM's own overall result has it)."""
    if missing:
        return _check("dcgm_diag", None, "no dcgmi", f"level {level}", False,
                      f"admission_dcgm_level is {level} but the host has no dcgmi (install DCGM, or set 0)")
    diag = parse_dcgm_diag(output)
    if diag is None or diag["runtime_error"] or not any(t["status"] == "pass" for t in diag["tests"]):
        why = ((diag or {}).get("runtime_error") or ("no test passed" if diag else None)
               or (output.strip().splitlines() or ["no output"])[0])
        return _check("dcgm_diag", None, "no result", f"level {level}", False,
                      f"dcgmi diag -r {level} gave no result: {why}")
    failed = [t for t in diag["tests"] if t["status"] == "fail"]
    return _check("dcgm_diag", None, [t["name"] for t in failed], f"level {level}: no test fails", not failed,
                  f"DCGM diagnostic level {level} failed: " + "; ".join(
                      f"{t['name']}" + (f" ({t['warnings'][0]})" if t["warnings"] else "") for t in failed))


def _bus_device(pci: str) -> str:
    """`bus:device` of a PCI address: nvidia-smi says 00000000:3B:00.0, the kernel's Xid line 0000:3b:00."""
    return ":".join(pci.lower().split(".")[0].split(":")[-2:])


def _check(name: str, gpu, value, threshold, ok: bool, reason: str = "") -> dict:
    return {"check": name, "gpu": gpu, "value": value, "threshold": threshold, "ok": ok,
            "reason": "" if ok else reason}


def verdict(gpus: list[dict], xids: list[dict], expected_count: int, min_memory_mib: int,
            min_pcie_gen: int | None, min_pcie_width: int | None, fabric_expected: bool,
            aggregate_uncorrectable_max: int = 0, nvlink: dict[int, dict] | None = None,
            nvlink_errors: dict[int, dict] | None = None) -> dict:
    """Every check on every GPU; `ok` only when all pass. `nvlink` (parse_nvlink), where the board's GPUs talk
    over NVLink: a GPU with an inactive link is refused (a GPU that lists no link is not judged);
    `nvlink_errors` (nvlink_errors.parse) judged by the catalog's thresholds (modelfleet/plan/nvlink_errors.py)."""
    checks = [_check("gpu_count", None, len(gpus), expected_count, len(gpus) >= expected_count,
                     f"{len(gpus)} GPU(s) answer, the inventory expects {expected_count}")]
    for gpu in gpus:
        i = gpu["index"]
        mem = gpu["memory_total_mib"] or 0
        checks.append(_check("memory", i, mem, min_memory_mib, mem >= min_memory_mib,
                             f"GPU {i} reports {mem} MiB, the board has {min_memory_mib} MiB"))
        checks.append(_check("persistence_mode", i, gpu["persistence_mode"], "Enabled",
                             gpu["persistence_mode"] == "Enabled", f"GPU {i}: persistence mode is off"))
        ecc = gpu["ecc"]
        checks.append(_check("ecc_volatile_uncorrectable", i, ecc["volatile_uncorrectable"], 0,
                             ecc["volatile_uncorrectable"] == 0,
                             f"GPU {i}: {ecc['volatile_uncorrectable']} uncorrectable ECC error(s) "
                             "since the driver loaded"))
        checks.append(_check("ecc_aggregate_uncorrectable", i, ecc["aggregate_uncorrectable"],
                             aggregate_uncorrectable_max, ecc["aggregate_uncorrectable"] <= aggregate_uncorrectable_max,
                             f"GPU {i}: {ecc['aggregate_uncorrectable']} uncorrectable ECC error(s) over its life"))
        pending = gpu["remapped"]["pending"] == "Yes" or gpu["retired_pending"] == "Yes"
        checks.append(_check("memory_repair_pending", i, gpu["remapped"]["pending"] or gpu["retired_pending"], "No",
                             not pending, f"GPU {i}: a row remap / page retirement waits for a GPU reset"))
        checks.append(_check("row_remap_failure", i, gpu["remapped"]["failure"], "No",
                             gpu["remapped"]["failure"] != "Yes", f"GPU {i}: row remapping failed (RMA)"))
        pcie = gpu["pcie"]
        if min_pcie_gen and pcie["gen"] is not None:
            checks.append(_check("pcie_gen", i, pcie["gen"], min_pcie_gen, pcie["gen"] >= min_pcie_gen,
                                 f"GPU {i}: PCIe link trained at Gen{pcie['gen']}, the board runs Gen{min_pcie_gen}"))
        if min_pcie_width and pcie["width"] is not None:
            checks.append(_check("pcie_width", i, pcie["width"], min_pcie_width, pcie["width"] >= min_pcie_width,
                                 f"GPU {i}: PCIe link trained at x{pcie['width']}, the board runs x{min_pcie_width}"))
        slow = [r for r in gpu["clock_events"] if r in SLOWDOWN_REASONS]
        checks.append(_check("clock_slowdown", i, slow, [], not slow,
                             f"GPU {i}: clocks held down by {', '.join(slow)}"))
        links = (nvlink or {}).get(i)
        if links:
            checks.append(_check("nvlink_inactive", i, links["inactive"], [], not links["inactive"],
                                 f"GPU {i}: NVLink link(s) {', '.join(map(str, links['inactive']))} of "
                                 f"{links['links']} inactive"))
        if (nvlink_errors or {}).get(i):
            checks.extend(nvlink_counters.checks(i, nvlink_errors[i]))
        if fabric_expected:
            state = gpu["fabric"]["state"]
            checks.append(_check("fabric_state", i, state, "Completed", state == "Completed",
                                 f"GPU {i}: NVLink fabric state is {state!r} (Fabric Manager has not finished)"))
    by_bus = {_bus_device(g["bus_id"]): g["index"] for g in gpus if g["bus_id"]}
    for event in xids:
        refuses, why = xid_catalog.judge(event["xid"])
        gpu = by_bus.get(_bus_device(event["pci"]), event["pci"])
        checks.append(_check("xid", gpu, event["xid"], "none needing more than the application", not refuses,
                             f"Xid {event['xid']} on {event['pci']} since boot"
                             + (f" ({event['text']})" if event.get("text") else "") + f": {why}"))
    return {"ok": all(c["ok"] for c in checks), "checks": checks,
            "reasons": [c["reason"] for c in checks if not c["ok"]]}


def admission_state(host_name: str, now: float | None = None) -> dict | None:
    """The host's last admission verdict (reports/admission on this control node): ok, its age in hours,
    and whether it still holds (a pass expires at valid_until); None when the host was never judged."""
    path = report_path("admission", host_name)
    if not path.exists():
        return None
    report = json.loads(path.read_text())
    now = time.time() if now is None else now
    judged = report.get("admitted_at") or path.stat().st_mtime
    return {"ok": report["ok"], "age_h": round((now - judged) / 3600, 1),
            "valid": bool(report["ok"] and report.get("valid_until") and now < report["valid_until"]),
            "reasons": report.get("reasons", [])}
