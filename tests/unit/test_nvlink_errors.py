"""NVLink error counters (`nvidia-smi nvlink -e`) read from the public H100 sample and the lab's B300 recording,
and judged by the catalog's thresholds (NVIDIA DCGM's health watch, with its source): a replay or recovery error
refuses the GPU naming GPU, link and counter; CRC counts are kept, not refused; admission's verdict carries it."""

from pathlib import Path

from modelfleet.plan import nvlink_errors
from tests.helpers.public_samples import public_sample_lines
from tests.unit.test_health import judge

B300 = Path(__file__).resolve().parents[2] / "lab" / "personas" / "b300x8-synthetic" / "nvidia-smi-nvlink-e.txt"


def test_the_public_h100_sample_is_read_per_link_skipping_the_authors_elision():
    counters = nvlink_errors.parse(public_sample_lines("h100-nvidia-smi-nvlink-e-excerpt.txt"))
    assert list(counters) == [0] and sorted(counters[0]) == [0, 1, 17]
    assert counters[0][17] == {"Replay Errors": 0, "Recovery Errors": 0, "CRC Errors": 0}
    assert nvlink_errors.nonzero(counters) == []


def test_the_lab_recording_holds_eight_gpus_of_eighteen_links_at_zero():
    counters = nvlink_errors.parse(B300.read_text().splitlines())
    assert sorted(counters) == list(range(8)) and all(sorted(links) == list(range(18)) for links in counters.values())
    assert all(nvlink_errors.checks(g, links) and all(c["ok"] for c in nvlink_errors.checks(g, links))
               for g, links in counters.items())


def test_a_replay_error_refuses_the_gpu_naming_its_link_and_counter_and_crc_is_only_kept():
    text = B300.read_text().replace("Link 5: Replay Errors: 0", "Link 5: Replay Errors: 37", 1)
    text = text.replace("Link 9: CRC Errors: 0", "Link 9: CRC Errors: 1204", 1)
    counters = nvlink_errors.parse(text.splitlines())
    failed = [c for c in nvlink_errors.checks(0, counters[0]) if not c["ok"]]
    assert [(c["counter"], c["value"], c["threshold"]) for c in failed] == [("Replay Errors", 37, 1)]
    assert failed[0]["reason"].startswith("GPU 0 NVLink link 5: 37 Replay Errors since the driver loaded")
    assert "DCGM" in failed[0]["reason"]
    assert nvlink_errors.nonzero(counters) == [{"gpu": 0, "link": 5, "counter": "Replay Errors", "value": 37},
                                               {"gpu": 0, "link": 9, "counter": "CRC Errors", "value": 1204}]
    assert all(c["ok"] for c in nvlink_errors.checks(1, counters[1]))  # the other GPUs are not blamed


def test_one_recovery_error_is_the_threshold_and_older_drivers_split_crc():
    lines = ["GPU 2: Tesla V100-SXM2-16GB (UUID: GPU-x)", "\t Link 3: Replay Errors: 0",
             "\t Link 3: Recovery Errors: 1", "\t Link 3: CRC Flit Errors: 5", "\t Link 3: CRC Data Errors: 0",
             "\t Link 4: Recovery Errors: 0", "NVML: Unable to get the NvLink link 5 error counters"]
    counters = nvlink_errors.parse(lines)
    assert counters == {2: {3: {"Replay Errors": 0, "Recovery Errors": 1, "CRC Flit Errors": 5,
                                "CRC Data Errors": 0}, 4: {"Recovery Errors": 0}}}
    failed = [c for c in nvlink_errors.checks(2, counters[2]) if not c["ok"]]
    assert [(c["counter"], c["reason"].split(" (")[0]) for c in failed] == [
        ("Recovery Errors", "GPU 2 NVLink link 3: 1 Recovery Errors since the driver loaded")]


def test_every_threshold_in_the_catalog_says_where_it_comes_from():
    data = nvlink_errors.catalog()
    assert "DCGM" in data["source"] and "DcgmHealthWatch.cpp" in data["source"]
    assert {n for n, r in data["counters"].items() if r["refuse_at"] is not None} == {"Replay Errors",
                                                                                       "Recovery Errors"}
    assert all(r["why"] for r in data["counters"].values())


def test_admission_refuses_on_the_counters_only_where_they_are_given():
    counters = {0: {5: {"Replay Errors": 37, "Recovery Errors": 0, "CRC Errors": 0}}}
    refused = judge(nvlink_errors=counters)  # the real H200 capture, with counters on its GPU 0
    assert not refused["ok"] and refused["reasons"] == [refused["reasons"][0]]
    assert refused["reasons"][0].startswith("GPU 0 NVLink link 5: 37 Replay Errors")
    assert judge(nvlink_errors=None)["ok"] and judge(nvlink_errors={})["ok"]
