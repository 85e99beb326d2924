"""Admission checks on real recorded output: the H200 capture passes; each fault, written into a copy of that
capture (synthetic, values as NVIDIA's tools print them; the fabric state from a public 580 sample), fails
with its own named reason."""

from pathlib import Path

import pytest

from modelfleet.host import health
from modelfleet.host.health import parse_smi_xml, parse_xids, verdict
from tests.helpers.public_samples import public_sample_lines

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
H200_XML = (FIXTURES / "gpu-hosts" / "h200x1-ubuntu2404" / "nvidia-smi-q-x.txt").read_text().split("__rc=")[0]
H200 = {"expected_count": 1, "min_memory_mib": 143771, "min_pcie_gen": 5, "min_pcie_width": 16,
        "fabric_expected": False}


def judge(xml: str = H200_XML, xids=(), **overrides):
    return verdict(parse_smi_xml(xml), list(xids), **{**H200, **overrides})


def test_the_real_h200_is_admitted():
    result = judge()
    assert result["ok"], result["reasons"]
    gpu = parse_smi_xml(H200_XML)[0]
    assert gpu["pcie"] == {"gen": 5, "max_gen": 5, "width": 16, "max_width": 16}
    assert gpu["memory_total_mib"] == 143771 and gpu["ecc"]["volatile_uncorrectable"] == 0
    assert gpu["clock_events"] == ["gpu_idle"]  # idle is not a slowdown


FAULTS = [
    ("uncorrectable ECC", ("<dram_uncorrectable>0</dram_uncorrectable>", "<dram_uncorrectable>2</dram_uncorrectable>"),
     "ecc_volatile_uncorrectable"),
    ("link trained down to x8", ("<current_link_width>16x</current_link_width>",
                                 "<current_link_width>8x</current_link_width>"), "pcie_width"),
    ("link trained down to Gen1", ("<current_link_gen>5</current_link_gen>", "<current_link_gen>1</current_link_gen>"),
     "pcie_gen"),
    ("thermal slowdown", ("<clocks_event_reason_hw_thermal_slowdown>Not Active",
                          "<clocks_event_reason_hw_thermal_slowdown>Active"), "clock_slowdown"),
    ("persistence off", ("<persistence_mode>Enabled</persistence_mode>",
                         "<persistence_mode>Disabled</persistence_mode>"), "persistence_mode"),
    ("row remap pending", ("<remapped_row_pending>No</remapped_row_pending>",
                           "<remapped_row_pending>Yes</remapped_row_pending>"), "memory_repair_pending"),
    ("row remap failure", ("<remapped_row_failure>No</remapped_row_failure>",
                           "<remapped_row_failure>Yes</remapped_row_failure>"), "row_remap_failure"),
    ("memory short", ("<total>143771 MiB</total>", "<total>71885 MiB</total>"), "memory"),
]


@pytest.mark.parametrize("case,edit,check", FAULTS, ids=[f[0] for f in FAULTS])
def test_each_fault_is_refused_by_name(case, edit, check):
    assert edit[0] in H200_XML
    result = judge(H200_XML.replace(edit[0], edit[1], 1))
    failed = [c["check"] for c in result["checks"] if not c["ok"]]
    assert not result["ok"] and failed == [check], failed


def test_fabric_not_finished_is_refused_where_nvswitch_is_used():
    # "In Progress": the state a public 580.159.04 sample shows before Fabric Manager registered the GPU
    # (tests/fixtures/public-samples/nvidia-smi-q-580-fabric-in-progress-excerpt.txt).
    sample = (FIXTURES / "public-samples" / "nvidia-smi-q-580-fabric-in-progress-excerpt.txt").read_text()
    state = next(line.split(":", 1)[1].strip() for line in sample.splitlines() if line.strip().startswith("State"))
    xml = H200_XML.replace("<fabric>\n\t\t\t<state>N/A</state>", f"<fabric>\n\t\t\t<state>{state}</state>", 1)
    result = judge(xml, fabric_expected=True)
    assert [c["check"] for c in result["checks"] if not c["ok"]] == ["fabric_state"]
    assert "In Progress" in result["reasons"][0]
    done = H200_XML.replace("<fabric>\n\t\t\t<state>N/A</state>", "<fabric>\n\t\t\t<state>Completed</state>", 1)
    assert judge(done, fabric_expected=True)["ok"]


def test_a_missing_gpu_and_a_fatal_xid_are_refused():
    assert [c["check"] for c in judge(expected_count=2)["checks"] if not c["ok"]] == ["gpu_count"]
    # The kernel log line's format, as NVIDIA's Xid catalog documents it (synthetic, bus id of the capture).
    lines = ["[ 812.332] NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
             "[ 900.001] NVRM: Xid (PCI:0000:00:06): 13, pid=4242, name=python3, Graphics Exception"]
    events = parse_xids(lines)
    assert [e["xid"] for e in events] == [79, 13]
    result = judge(xids=events)
    failed = [c for c in result["checks"] if not c["ok"]]
    assert [(c["check"], c["value"], c["gpu"]) for c in failed] == [("xid", 79, 0)]  # 13 is an application's
    assert "fallen off the bus" in result["reasons"][0] and "NVIDIA's action RESTART_BM: reboot the node" in \
        result["reasons"][0]


def test_status_shows_each_hosts_admission_and_its_age(tmp_path, monkeypatch):
    import json

    from modelfleet.fleet import status as fleet_status

    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    (tmp_path / "admission").mkdir()
    now = 1_000_000.0
    reports = {"fresh": {"ok": True, "admitted_at": now - 7200, "valid_until": now + 3600, "reasons": []},
               "stale": {"ok": True, "admitted_at": now - 90000, "valid_until": now - 3600, "reasons": []},
               "bad": {"ok": False, "admitted_at": None, "valid_until": None, "reasons": ["GPU 0: x8"]}}
    for host, report in reports.items():
        (tmp_path / "admission" / f"{host}.json").write_text(json.dumps(report))
    states = {host: health.admission_state(host, now) for host in [*reports, "never"]}
    assert states["fresh"] == {"ok": True, "age_h": 2.0, "valid": True, "reasons": []}
    assert not states["stale"]["valid"] and not states["bad"]["ok"] and states["never"] is None
    rows = [{"host": host, "reachable": True, "admission": state, "gpus": [],
             "services": [{"pool": "p", "gpu_indices": [0], "state": "active/running", "health": "200",
                           "restarts": 0, "revision": "a" * 40, "image": "i"}]} for host, state in states.items()]
    cells = [line.split()[1] for line in fleet_status.status_table(rows).splitlines()[1:]]
    assert cells == ["2.0h", "expired", "refused", "-"]



def test_nvlink_status_parsed_from_public_samples_and_the_real_h200():
    h100 = health.parse_nvlink(public_sample_lines("h100-nvidia-smi-nvlink-status-i0.txt"))
    assert h100 == {0: {"links": 18, "inactive": []}}
    b300 = health.parse_nvlink(public_sample_lines("b300x7-nvidia-smi-nvlink-status.txt"))
    assert sorted(b300) == list(range(7)) and all(g == {"links": 18, "inactive": []} for g in b300.values())
    v100 = health.parse_nvlink(public_sample_lines("v100-nvidia-smi-nvlink-s-inactive.txt"))
    assert v100 == {3: {"links": 6, "inactive": [3, 5]}}
    # The lent H200 (one GPU in a VM): `nvidia-smi nvlink --status` printed nothing, rc 0
    real = (FIXTURES / "gpu-hosts" / "h200x1-ubuntu2404" / "nvidia-smi-nvlink-status.txt").read_text()
    assert health.parse_nvlink(real.split("__rc=")[0].splitlines()) == {}


def test_an_inactive_nvlink_refuses_its_gpu_and_a_gpu_listing_no_link_is_not_judged():
    inactive = health.parse_nvlink(public_sample_lines("v100-nvidia-smi-nvlink-s-inactive.txt"))
    gpus = parse_smi_xml(H200_XML)
    for gpu in gpus:
        gpu["index"] = 3  # the capture's one GPU, numbered as the sample's
    result = verdict(gpus, [], **{**H200, "nvlink": inactive})
    assert not result["ok"] and result["reasons"] == ["GPU 3: NVLink link(s) 3, 5 of 6 inactive"]
    assert judge(nvlink={0: {"links": 18, "inactive": []}})["ok"]
    assert judge(nvlink={})["ok"]


def test_a_gpu_off_the_bus_without_an_xid_line_counts_as_xid_79():
    three_lines = parse_xids(public_sample_lines("nvrm-fallen-off-the-bus-without-xid-570.txt"))
    assert three_lines == [{"pci": "0000:b3:00.0", "xid": 79,
                            "text": "GPU has fallen off the bus (reported without an Xid line)"}]
    one_line = parse_xids(public_sample_lines("nvrm-gpu-at-fallen-off-the-bus-single-line.txt"))
    assert [(e["pci"], e["xid"]) for e in one_line] == [("0000:01:00.0", 79)]  # reported twice, counted once
    gpus = parse_smi_xml(H200_XML)
    gpus[0]["bus_id"] = "00000000:B3:00.0"
    report = verdict(gpus, three_lines, expected_count=1, min_memory_mib=143771, min_pcie_gen=5,
                     min_pcie_width=16, fabric_expected=False)
    assert not report["ok"] and [c["gpu"] for c in report["checks"] if not c["ok"]] == [0]


def test_the_remote_grep_keeps_what_the_off_bus_parser_needs():
    import subprocess

    from modelfleet.host.health import KERNEL_LOG_PATTERN
    for name in ("nvrm-fallen-off-the-bus-without-xid-570.txt", "nvrm-gpu-at-fallen-off-the-bus-single-line.txt"):
        lines = public_sample_lines(name)
        kept = subprocess.run(["grep", "-E", KERNEL_LOG_PATTERN], input="\n".join(lines), capture_output=True,
                              text=True).stdout.splitlines()
        assert parse_xids(kept) == parse_xids(lines) != [], name
