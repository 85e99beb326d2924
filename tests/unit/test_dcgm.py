"""DCGM's diagnostic for admission (pure): `dcgmi diag -j` in DCGM 3's layout (NVIDIA's own test string) and DCGM
4's (shaped after NVIDIA's JSON schema: no verbatim DCGM 4 output was found), and the dcgm_diag check."""

from modelfleet.base.host_commands import DCGM_MISSING, dcgm_diag_sh
from modelfleet.host.health import dcgm_check, parse_dcgm_diag
from modelfleet.plan.inventory import resolve
from modelfleet.run.stages.admission import judge
from tests.helpers.public_samples import public_sample


def test_dcgm3_layout_is_read_and_a_skip_on_one_gpu_passes():
    diag = parse_dcgm_diag(public_sample("dcgm3-diag-json-nvidia-test-string-excerpt.txt"))
    assert [(t["name"], t["status"]) for t in diag["tests"]] == [
        # memory: skipped on GPU 0, passed on 1
        ("Denylist", "pass"), ("NVML Library", "pass"), ("Persistence Mode", "pass"), ("memory", "pass")]
    check = dcgm_check(1, public_sample("dcgm3-diag-json-nvidia-test-string-excerpt.txt"), missing=False)
    assert check["ok"] and check["value"] == []


def test_dcgm4_layout_fails_on_a_failed_test_naming_it_and_its_warning():
    text = ("WARNING: a line dcgmi printed before the JSON\n"
            + public_sample("dcgm4-diag-json-schema-shaped-memory-fail.txt"))
    diag = parse_dcgm_diag(text)
    assert [(t["category"], t["name"], t["status"]) for t in diag["tests"]] == [
        ("Deployment", "software", "pass"), ("Hardware", "memory", "fail")]
    check = dcgm_check(2, text, missing=False)
    assert not check["ok"] and check["value"] == ["memory"]
    assert check["reason"] == ("DCGM diagnostic level 2 failed: memory (GPU 1: Memory error detected: a double-bit "
                               "ECC error on a write test)")


def test_no_dcgmi_or_no_json_or_no_test_refuses():
    assert "has no dcgmi" in dcgm_check(1, DCGM_MISSING, missing=True)["reason"]
    no_engine = "Error: unable to establish a connection to the specified host: localhost"  # wording not verbatim
    assert dcgm_check(1, no_engine, missing=False)["reason"] == f"dcgmi diag -r 1 gave no result: {no_engine}"
    empty = dcgm_check(1, '{"DCGM Diagnostic": {"test_categories": []}}', missing=False)
    assert empty["reason"] == "dcgmi diag -r 1 gave no result: no test passed"
    skipped = '{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [' \
              '{"name": "memory", "results": [], "test_summary": {"status": "Not Run"}}]}]}}'
    assert not dcgm_check(1, skipped, missing=False)["ok"]
    error = dcgm_check(1, '{"DCGM Diagnostic": {"runtime_error": "GPU 0 is busy"}}', missing=False)
    assert error["reason"].endswith("GPU 0 is busy")


def test_the_command_asks_for_json_at_the_level_and_says_when_dcgmi_is_absent():
    command = dcgm_diag_sh(2)
    assert "dcgmi diag -r 2 -j" in command and DCGM_MISSING in command


def test_the_verdict_carries_the_dcgm_check_and_the_inventory_bounds_the_level():
    data = {"hardware": "h200", "gpu_count": 1, "model": "qwen3-8b", "engine": "vllm", "admission_dcgm_level": 2}
    plan = resolve([("h", data)]).hosts["h"]
    assert plan.admission_dcgm_level == 2
    assert any(f == "admission_dcgm_level" for _, f, _ in resolve([("h", {**data, "admission_dcgm_level": 5})]).errors)
    from tests.stages.test_admission import health
    failed = dcgm_check(2, public_sample("dcgm4-diag-json-schema-shaped-memory-fail.txt"), missing=False)
    report = judge(plan, health(1, {}), {}, failed)
    assert not report["ok"] and report["reasons"] == [failed["reason"]]
    passed = dcgm_check(1, public_sample("dcgm3-diag-json-nvidia-test-string-excerpt.txt"), missing=False)
    assert judge(plan, health(1, {}), {}, passed)["ok"]
