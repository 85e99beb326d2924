"""The host record in `status --json` (modelfleet.host.host_record): what status's round trip prints after its own
sections (the OS read as preflight reads it, the module's signer, Fabric Manager, IMEX, VBIOS) and what this
control node knows (pools' images and revisions, the admission report) in one dict; an admission past its
expiry says so; status's own parse stops where the record starts."""

from pathlib import Path

from modelfleet.fleet import status as fleet_status
from modelfleet.host import host_record
from modelfleet.plan.inventory import resolve

OS = (Path(__file__).parents[1] / "fixtures" / "gpu-hosts" / "h200x1-ubuntu2404" / "os-release.txt").read_text()
OUTPUT = (f"@@modelfleet-status host\ndriver=580.159.04\nboot=abc\n@@modelfleet-status gpus\n0, 10, 143771\n"
          f"{host_record.MARK} os\n{OS}KERNEL_RELEASE=6.8.0-87-generic\nMACHINE_ARCH=x86_64\n"
          "SECURE_BOOT=SecureBoot enabled\n"
          f"{host_record.MARK} tools\nsigner=Canonical Ltd. Kernel Module Signing\nfabric_manager=580.159.04\n"
          f"imex=\nvbios=96.00.AF.00.01 \n{host_record.MARK} end\n")
SERVICES = [{"pool": "p", "image": "vllm/vllm-openai@sha256:" + "1" * 64, "image_id": "sha256:" + "2" * 64,
             "revision": "e" * 40, "state": "active/running"}]


def plan():
    return resolve([("h1", {"hardware": "h200", "gpu_count": 8, "model": "kimi-k2-thinking", "engine": "vllm",
                            "pool": "p", "revision": "e" * 40})]).hosts["h1"]


def test_the_record_carries_what_the_host_is():
    admitted = {"ok": True, "admitted_at": 1000.0, "valid_until": 1000.0 + 24 * 3600, "reasons": [],
                "nvlink_errors": [{"gpu": 0, "link": 9, "counter": "CRC Errors", "value": 12}]}
    got = host_record.record(plan(), OUTPUT, "580.159.04", SERVICES, admitted, now=2000.0)
    assert got == {
        "os": "Ubuntu 24.04.3 LTS", "kernel": "6.8.0-87-generic", "kernel_flavour": "generic",
        "secure_boot": "enabled",
        "driver": {"branch": "580", "version": "580.159.04", "source": "ubuntu-signed",
                   "module_signer": "Canonical Ltd. Kernel Module Signing"},
        "fabric_manager": "580.159.04", "imex": None, "vbios": ["96.00.AF.00.01"],
        "pools": {"p": {"image": SERVICES[0]["image"], "image_id": SERVICES[0]["image_id"], "revision": "e" * 40}},
        "admission": {"ok": True, "at": 1000.0, "valid_until": 1000.0 + 24 * 3600, "expired": False,
                      "reasons": [], "nvlink_errors": [{"gpu": 0, "link": 9, "counter": "CRC Errors", "value": 12}]}}


def test_an_admission_past_its_expiry_or_never_made_says_so():
    admitted = {"ok": True, "admitted_at": 1000.0, "valid_until": 5000.0, "reasons": []}
    assert host_record.record(plan(), OUTPUT, None, [], admitted, now=5000.0)["admission"]["expired"]
    refused = {"ok": False, "admitted_at": None, "valid_until": None, "reasons": ["GPU 3: fallen off the bus"]}
    assert host_record.record(plan(), OUTPUT, None, [], refused, now=5000.0)["admission"] == {
        "ok": False, "at": None, "valid_until": None, "expired": False, "reasons": ["GPU 3: fallen off the bus"],
        "nvlink_errors": []}  # a report written before the counters were read has none
    assert host_record.record(plan(), "", None, [], None)["admission"] is None


def test_status_parse_stops_where_the_record_starts():
    parsed = fleet_status.parse_status(OUTPUT)
    assert parsed["host"] == {"driver": "580.159.04", "boot": "abc"} and len(parsed["gpus"]) == 1
    assert host_record.MARK in fleet_status.status_script(plan()).rsplit("@@modelfleet-status", 1)[1]


def test_admission_s_read_carries_the_module_signer():
    from modelfleet.host.facts.health import MARK, GpuHealth

    signed = GpuHealth().process([f"{MARK} id", "6.8.0-87-generic", "b00t", f"{MARK} signer",
                                  "Canonical Ltd. Kernel Module Signing"])
    assert signed["module_signer"] == "Canonical Ltd. Kernel Module Signing" and signed["kernel"] == "6.8.0-87-generic"
    assert GpuHealth().process([f"{MARK} id", "6.8.0-87-generic", "b00t", f"{MARK} signer"])["module_signer"] is None
    assert "modinfo -F signer nvidia" in GpuHealth().command()
