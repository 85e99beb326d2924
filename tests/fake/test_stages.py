"""Stage tests through pyinfra's @fake connector: the commands a real run would send, and none when converged."""

import hashlib
import json

import pytest
from pyinfra.api.exceptions import PyinfraError

from modelfleet import render  # noqa: E402
from modelfleet.facts.probe import HostProbe  # noqa: E402
from modelfleet.inventory import resolve  # noqa: E402
from modelfleet.pipeline import run_stages  # noqa: E402
from modelfleet.stages import exporters, images, preflight, service  # noqa: E402

PIN = "e" * 40


def serve():
    """serve.py without the verify gate: a @fake host has no endpoint for the openai client to reach."""
    run_stages(preflight, images, service)

IMAGE = "vllm/vllm-openai:v0.34.0@sha256:" + "f" * 64
# Synthetic 8x B300 GPU rows in the format of the recorded H200 query (values from public B300 samples).
B300_GPUS = [f"{i}, NVIDIA B300 SXM6 AC, GPU-0000000{i}-synthetic, 00000000:{i:02X}:00.0, 275040 MiB, 580.95.05, 10.3"
             for i in range(8)]
B300_VERSIONS = ["NVIDIA-SMI version  : 580.95.05", "DRIVER version      : 580.95.05", "CUDA Version        : 13.0"]
DF = ["Filesystem 1-blocks Used Available Capacity Mounted on",
      "/dev/md0 30000000000000 1000000000 29000000000000 1% /srv"]


def b300_host():
    return {"hardware": "b300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": PIN, "pool": "k31",
            "served_name": "kimi-local", "image": IMAGE}


FM = ["nvswitches=0", "Fabric Manager version is : 580.95.05"]


def b300_probe(fake, gpus=B300_GPUS, versions=B300_VERSIONS, fabric_manager=FM):
    return fake.probe_reply({"nvidia_gpus": gpus, "nvidia_versions": versions, "disk": DF, "ports": [],
                        "fabric_manager": fabric_manager})


@pytest.fixture(autouse=True)
def reports(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    return tmp_path / "preflight"


def changed_ops(state, name):
    host = state.inventory.get_host(f"@fake/{name}")
    return [state.get_op_meta(h).names for h in state.get_op_order()
            if state.get_op_data_for_host(host, h).operation_meta.did_change()]


def test_b300_kimi_serve_sends_the_guides_command(fake, uploads, monkeypatch):
    host = {**b300_host(), "fake_responses": {"@@modelfleet-probe": b300_probe(fake)}}
    state = fake.run_fake([("b300-01", host)], serve)
    commands = fake.executed(state, "b300-01")
    assert f"docker pull --quiet {IMAGE}" in commands
    assert "systemctl daemon-reload" in commands
    assert "systemctl start modelfleet-k31.service" in commands
    assert "systemctl enable modelfleet-k31.service" in commands
    unit = uploads.files["/etc/systemd/system/modelfleet-k31.service"]
    for flag in ("--tensor-parallel-size 8", "--trust-remote-code", "--load-format fastsafetensors",
                 "--enable-auto-tool-choice", "--tool-call-parser kimi_k3", "--reasoning-parser kimi_k3",
                 "--max-model-len 32768", "--host 127.0.0.1", "--port 8000", "--served-model-name kimi-local"):
        assert flag in unit
    assert IMAGE in unit
    assert uploads.files["/etc/modelfleet/k31.env"].endswith("VLLM_ENGINE_READY_TIMEOUT_S=3600\n")
    assert any("curl -fsS -m 5 http://127.0.0.1:8000/health" in c for c in commands)


def converged_replies(fake, svc):
    def file_line(content, mode):
        return f"file {mode} root root {hashlib.sha256(content.encode()).hexdigest()}"

    state = ["@@modelfleet-state path /etc/modelfleet", "dir 700 root root -",
             f"@@modelfleet-state path {svc.model_dir}", "dir 755 root root -",
             f"@@modelfleet-state path /etc/systemd/system/{svc.unit_name}", file_line(render.render_unit(svc), 644),
             "@@modelfleet-state path /etc/modelfleet/k31.env", file_line(render.render_env(svc), 600),
             f"@@modelfleet-state unit {svc.unit_name}", "ActiveState=active", "UnitFileState=enabled",
             f"@@modelfleet-state image {IMAGE}", "id=sha256:" + "1" * 64]
    cache = render.engine_cache(svc)
    state += [f"@@modelfleet-state path {cache.root}", "dir 755 root root -",
              f"@@modelfleet-state path {cache.dir}", "dir 755 root root -",
              f"@@modelfleet-state path {cache.key_file}", file_line(cache.key_json, 644)]
    return {
        "@@modelfleet-probe": b300_probe(fake),
        "@@modelfleet-state": state,
    }


def test_converged_b300_host_gets_no_commands(fake):
    svc = resolve([("@fake/b300-01", b300_host())]).hosts["@fake/b300-01"].services[0]
    host = {**b300_host(), "fake_responses": converged_replies(fake, svc)}
    state = fake.run_fake([("b300-01", host)], serve)
    assert changed_ops(state, "b300-01") == []
    # Two round trips: the preflight probe, and what the stages find deployed (files, units, images).
    assert len(fake.executed(state, "b300-01")) == 2, fake.executed(state, "b300-01")


def test_replicas_share_one_unit_name_and_a_replicas_unit_under_its_pool_name_is_retired(fake, uploads, monkeypatch):
    """Replicas (no `pool`) are pools of their own named after their host, but their units are named after
    what they serve; a unit of the replica under its pool's (host's) name is stopped and removed before the new
    one starts."""
    replica = {k: v for k, v in b300_host().items() if k != "pool"}
    plans = resolve([("@fake/r1", replica), ("@fake/r2", replica)]).hosts
    assert {p.services[0].unit_name for p in plans.values()} == {"modelfleet-kimi-local.service"}
    assert len({p.services[0].pool for p in plans.values()}) == 2  # each replica its own pool
    first = plans["@fake/r1"].services[0]
    old = first.legacy_unit_name
    assert old == f"modelfleet-{first.pool}.service"
    replies = {"@@modelfleet-probe": b300_probe(fake),
               "@@modelfleet-state": [f"@@modelfleet-state path /etc/systemd/system/{old}", "file 644 root root " + "0" * 64,
                                      f"@@modelfleet-state unit {old}", "ActiveState=active", "UnitFileState=enabled"]}
    state = fake.run_fake([("r1", {**replica, "fake_responses": replies})], serve)
    commands = fake.executed(state, "r1")
    assert "/etc/systemd/system/modelfleet-kimi-local.service" in uploads.files
    retired = commands.index(f"systemctl disable --now {old}")
    assert commands[retired + 1] == f"rm -f -- /etc/systemd/system/{old}"
    assert retired < commands.index("systemctl start modelfleet-kimi-local.service")


def test_preflight_refuses_a_host_with_too_few_gpus_and_old_driver(fake, reports):
    old = [line.replace("580.95.05", "570.158.01") for line in B300_VERSIONS]
    host = {**b300_host(), "fake_responses": {"@@modelfleet-probe": b300_probe(fake, B300_GPUS[:7], old)}}
    state = fake.run_fake([("b300-01", host)], serve, dry=True)
    with pytest.raises(PyinfraError, match="No hosts remaining"):
        fake.finish(state)
    commands = fake.executed(state, "b300-01")
    assert not any(c.startswith("docker pull") for c in commands)  # later stages never added
    report = json.loads((reports / "_fake_b300-01.json").read_text())
    assert not report["ok"]
    joined = "\n".join(report["problems"])
    assert "GPU count: inventory says 8x b300, host has 7" in joined
    assert "driver 570.158.01 < 580" in joined


def h200_probe(fake):
    return HostProbe().process(h200_probe_lines(fake))


def h200_probe_lines(fake, gpu_health=None):
    return fake.probe_reply({**({"gpu_health": gpu_health} if gpu_health else {}),
        "nvidia_gpus": fake.recorded(fake.H200 / "nvidia-smi-query-gpu-header.txt"),
        "nvidia_versions": fake.recorded(fake.H200 / "nvidia-smi-version.txt"),
        "nvidia_module": fake.recorded(fake.H200 / "proc-driver-version.txt"),
        "topology": fake.recorded(fake.H200 / "nvidia-smi-topo.txt"),
        "amd_gpus": None,
        "block_devices": fake.recorded(fake.H200 / "lsblk-json.txt"),
        "os": fake.recorded(fake.H200 / "os-release.txt"),
        "ports": [], "runtime": ["docker=none", "server=none", "runtimes=", "nvidia_ctk=none"],
        "disk": ["Filesystem 1-blocks Used Available Capacity Mounted on",
                 "/dev/vda 270553174016 17286574080 68702363648 21% /"],
    })


def test_preflight_on_recorded_h200_accepts_small_model_and_refuses_kimi(fake):
    plan = resolve([("h200", {"hardware": "h200", "gpu_count": 1, "model": "qwen3-8b", "engine": "vllm",
                              "assess_models": ["kimi-k3.1-pro", "qwen3-8b"]})]).hosts["h200"]
    report = preflight.evaluate(plan, h200_probe(fake))
    assert report["ok"], report["problems"]
    assert report["gpus"] == [{"name": "NVIDIA H200", "memory_total_mib": 143771}]
    assert (report["driver"], report["cuda"]) == ("580.159.04", "13.0")
    assert report["kernel_module"] == {"version": "580.159.04", "open": True, "arch": "x86_64"}
    verdicts = {a["model"]: a for a in report["assessed"]}
    assert not verdicts["kimi-k3.1-pro"]["fits"] and "1x h200" in verdicts["kimi-k3.1-pro"]["reason"]
    assert verdicts["qwen3-8b"]["fits"]


def test_dcgm_exporter_unit_on_an_nvidia_host_when_asked(fake, uploads, monkeypatch):

    dcgm = "nvcr.io/nvidia/k8s/dcgm-exporter:4.4.2-4.7.1-ubuntu22.04@sha256:" + "d" * 64
    host = {**b300_host(), "dcgm_exporter": True, "dcgm_exporter_image": dcgm, "fabric_address": "10.0.0.7",
            "fake_responses": {"@@modelfleet-probe": b300_probe(fake)}}
    state = fake.run_fake([("b300-01", host)], lambda: run_stages(preflight, exporters))
    unit = uploads.files["/etc/systemd/system/modelfleet-dcgm-exporter.service"]
    assert "--device nvidia.com/gpu=all" in unit and "--cap-add SYS_ADMIN" in unit and dcgm in unit
    assert "--address 10.0.0.7:9400" in unit
    commands = fake.executed(state, "b300-01")
    assert "systemctl enable modelfleet-dcgm-exporter.service" in commands
    assert "systemctl start modelfleet-dcgm-exporter.service" in commands


EXPORTER = "modelfleet-dcgm-exporter.service"
OVERRIDE = f"/etc/systemd/system/{EXPORTER}.d/override.conf"


def exporter_with_a_drop_in(fake, uploads, **data):
    """The DCGM exporter's unit as modelfleet wrote it, active, plus a drop-in that replaces its command; the
    commands the run sent, what it uploaded, and whether it failed."""
    host = {**b300_host(), "dcgm_exporter": True, "fabric_address": "10.0.0.7", **data,
            "dcgm_exporter_image": "nvcr.io/nvidia/k8s/dcgm-exporter:4.4.2-4.7.1-ubuntu22.04@sha256:" + "d" * 64}
    plan = resolve([("b300-01", host)]).hosts["b300-01"]
    unit = exporters.dcgm_unit(plan)
    state_reply = [
        f"@@modelfleet-state path {exporters.UNIT_PATH}",
        f"file 644 root root {hashlib.sha256(unit.encode()).hexdigest()}",
        f"@@modelfleet-state unit {EXPORTER}", "LoadState=loaded", "ActiveState=active", "UnitFileState=enabled",
        f"FragmentPath={exporters.UNIT_PATH}", f"DropInPaths={OVERRIDE}", "NeedDaemonReload=no",
        f"@@modelfleet-state dropin {EXPORTER} {OVERRIDE}", "= [Service]", "= ExecStart=", "= ExecStart=/bin/true"]
    host["fake_responses"] = {"@@modelfleet-probe": b300_probe(fake), "@@modelfleet-state": state_reply}
    state = fake.run_fake([("b300-01", host)], lambda: run_stages(preflight, exporters), dry=True)
    try:
        fake.finish(state)
        failed = False
    except PyinfraError:
        failed = True
    return fake.executed(state, "b300-01"), uploads, failed


def test_a_drop_in_on_the_exporter_unit_is_removed_and_the_exporter_restarted(fake, uploads):
    commands, uploads, failed = exporter_with_a_drop_in(fake, uploads)
    assert not failed and exporters.UNIT_PATH not in uploads.files  # its own file is unchanged
    removed = commands.index(f"rm -f -- {OVERRIDE}")
    assert removed < commands.index("systemctl daemon-reload") < commands.index(f"systemctl restart {EXPORTER}")


def test_a_drop_in_on_the_exporter_unit_is_refused_where_the_host_keeps_its_own(fake, uploads):
    commands, uploads, failed = exporter_with_a_drop_in(fake, uploads, unit_dropins="keep")
    assert failed and not uploads.files
    assert not [c for c in commands if c.startswith(("systemctl", "rm "))], commands  # only the reads ran


@pytest.mark.parametrize("fm, problem", [
    (["nvswitches=4"], "Fabric Manager: not installed; b300 with NVSwitch needs nvidia-fabricmanager at the driver's version (580.95.05)"),
    (["nvswitches=4", "Fabric Manager version is : 590.48.01"],
     "Fabric Manager 590.48.01 does not match driver 580.95.05 (the usual cause of CUDA error 802)"),
    (FM, None),
])
def test_preflight_checks_fabric_manager_against_the_driver(fake, fm, problem):
    plan = resolve([("b300-01", b300_host())]).hosts["b300-01"]
    report = preflight.evaluate(plan, HostProbe().process(b300_probe(fake, fabric_manager=fm)))
    matching = [p for p in report["problems"] if p.startswith("Fabric Manager")]
    assert (matching[0].startswith(problem) if problem else not matching), report["problems"]


def test_a_single_gpu_of_an_nvswitch_board_needs_no_fabric_manager():
    plan = resolve([("h200", {"hardware": "h200", "gpu_count": 1, "model": "qwen3-8b", "engine": "vllm"})]).hosts["h200"]
    assert preflight.fabric_manager_problems(plan, {"fabric_manager": {"nvswitches": 0, "version": None}}) == []


def health_reply(xml: str, xid_lines=()) -> list[str]:
    return ["@@modelfleet-health smi", *xml.splitlines(), "@@modelfleet-health kernel", *xid_lines,
            "@@modelfleet-health id", "6.8.0-31-generic", "0d9c7b5e-1111-4c2b-9b1a-2c7d3e4f5a6b"]


def admission_host(fake, xml: str, xid_lines=()):
    """The health read rides in preflight's probe: one reply, no round trip of its own."""
    return {"hardware": "h200", "gpu_count": 1, "model": "qwen3-8b", "engine": "vllm",
            "fake_responses": {"@@modelfleet-probe": h200_probe_lines(fake, health_reply(xml, xid_lines))}}


def test_admission_admits_the_recorded_h200_and_refuses_a_fallen_gpu(fake, tmp_path, monkeypatch):
    from modelfleet.stages import admission

    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    xml = (fake.H200 / "nvidia-smi-q-x.txt").read_text().split("__rc=")[0]
    state = fake.run_fake([("h200", admission_host(fake, xml))], lambda: run_stages(preflight, admission))
    report = json.loads((tmp_path / "admission" / "_fake_h200.json").read_text())
    assert report["ok"] and not state.failed_hosts and report["fingerprint"]["serials"] == ["1653824070535"]
    assert report["fingerprint"]["driver"] == "580.159.04"
    assert len(fake.executed(state, "h200")) == 1  # the probe carried the health read: one command in all
    assert report["valid_until"] - report["admitted_at"] == 24 * 3600
    fallen = ["NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."]
    with pytest.raises(PyinfraError, match="No hosts remaining"):  # the one host was refused
        fake.run_fake([("h200", admission_host(fake, xml, fallen))], lambda: run_stages(preflight, admission))
    report = json.loads((tmp_path / "admission" / "_fake_h200.json").read_text())
    assert not report["ok"] and "fallen off the bus" in report["reasons"][0] and report["valid_until"] is None


def test_a_refused_host_fails_its_whole_pool_like_the_gate(fake, tmp_path, monkeypatch):
    """Two hosts of one pool: the healthy one is admitted on its own checks, but its pool may not start."""
    from modelfleet.stages import admission

    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    xml = (fake.H200 / "nvidia-smi-q-x.txt").read_text().split("__rc=")[0]
    fallen = ["NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."]
    pool = {"model": "tiny-lab", "recipe": "tiny-lab-vllm-dp2", "pool": "pair"}
    hosts = [("good", {**admission_host(fake, xml), **pool, "ssh_hostname": "192.0.2.1"}),
             ("bad", {**admission_host(fake, xml, fallen), **pool, "ssh_hostname": "192.0.2.2"})]
    state = fake.run_fake(hosts, lambda: run_stages(preflight, admission), dry=True)
    with pytest.raises(PyinfraError, match="No hosts remaining"):  # both: the bad one and, for it, the good one
        fake.finish(state)
    good = json.loads((tmp_path / "admission" / "_fake_good.json").read_text())
    assert good["ok"]  # its own GPUs pass; the pool gate is what stops it
    assert state.inventory.get_host("@fake/good") in state.failed_hosts
