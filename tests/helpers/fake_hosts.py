"""Hosts for stage runs through pyinfra's @fake connector: an 8x B300 host serving Kimi K3.1 Pro (synthetic GPU
rows in the recorded H200 query's format, values from public B300 samples), the recorded H200 host's probe, and
what a converged host replies."""

import hashlib

from modelfleet.host.facts.probe import HostProbe
from modelfleet.plan import render
from modelfleet.run.pipeline import run_stages
from modelfleet.run.stages import images, preflight, service

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


def changed_ops(state, name):
    host = state.inventory.get_host(f"@fake/{name}")
    return [state.get_op_meta(h).names for h in state.get_op_order()
            if state.get_op_data_for_host(host, h).operation_meta.did_change()]


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
              f"@@modelfleet-state path {cache.key_file}", file_line(cache.key_json, 644),
              "@@modelfleet-state text /proc/self/mountinfo",  # the caches' bind mount, nosuid,nodev
              f"= 120 36 8:1 {cache.root.rsplit('/', 1)[0]} {cache.root.rsplit('/', 1)[0]} rw,nosuid,nodev - xfs "
              "/dev/md0 rw"]
    return {
        "@@modelfleet-probe": b300_probe(fake),
        "@@modelfleet-state": state,
    }


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


def health_reply(xml: str, xid_lines=()) -> list[str]:
    return ["@@modelfleet-health smi", *xml.splitlines(), "@@modelfleet-health kernel", *xid_lines,
            "@@modelfleet-health id", "6.8.0-31-generic", "0d9c7b5e-1111-4c2b-9b1a-2c7d3e4f5a6b"]


def admission_host(fake, xml: str, xid_lines=()):
    """The health read rides in preflight's probe: one reply, no round trip of its own."""
    return {"hardware": "h200", "gpu_count": 1, "model": "qwen3-8b", "engine": "vllm",
            "fake_responses": {"@@modelfleet-probe": h200_probe_lines(fake, health_reply(xml, xid_lines))}}


