"""The experts in host RAM, for real: serve.py deploys the tiny mixture-of-experts GGUF (the hub double's revision
`moe`, lab/tiny_gguf.py with 8 experts per layer) on the lab's llama.cpp host with recipe tiny-lab-llamacpp-moe,
whose line carries the Kimi K3 one-GPU-plus-RAM recipes' offload flags (--n-gpu-layers 999 --cpu-moe), and the
real llama-server (Debian's build 11669) answers the verify gate.

The lab's llama-server is a CPU build: every buffer is host memory with or without --cpu-moe ("CPU_Mapped model
buffer size" either way, no CUDA buffer), so the buffer summary cannot tell the offload apart. What does is
llama.cpp's buffer-type override, which only --cpu-moe (or --override-tensor) sets up: at the default verbosity
the server warns "tensor overrides to CPU are used with mmap enabled", and at --log-verbosity 5 (asked for here
through the inventory's extra_args) it logs, tensor by tensor, "tensor blk.N.ffn_up_exps.weight (...) buffer
type overridden to CPU". The test holds the host's journal of the running unit to exactly the experts' tensors
being overridden to CPU, and no other tensor. Whether the rest lands on a GPU is for a GPU host to show."""

import json
import os
import re
import time

import pytest

from lab import scenario, ssh
from lab.hub import MOE_EXPERTS, MOE_FILE
from lab.tiny_gguf import LAYERS
from modelfleet import REPO_ROOT
from modelfleet.base.commands import run_pyinfra

pytestmark = pytest.mark.lab

OVERRIDE = re.compile(r"tensor (\S+) \(.*\) buffer type overridden to (\S+)")


@pytest.fixture(scope="module")
def moe(lab_hosts, tmp_path_factory):
    spec = next(s for s in lab_hosts if s["engine"] == "llama.cpp")
    reports = tmp_path_factory.mktemp("moe") / "reports"
    env = {**os.environ, "MODELFLEET_REPORTS": str(reports)}
    start = time.monotonic()
    with scenario.applied(only=[spec["name"]], moe=spec["name"], extra_args=["--log-verbosity", "5"]):
        served = run_pyinfra("inventories/lab.py", "deploys/serve.py", env=env, cwd=REPO_ROOT, timeout=600)
    assert served.returncode == 0, (served.stdout + served.stderr)[-4000:]
    print(f"serve.py with the MoE recipe: {time.monotonic() - start:.1f} s")
    unit = f"modelfleet-tiny-{spec['name']}.service"
    return spec, unit, reports


def test_the_verify_gate_passes_against_the_offloaded_moe(moe):
    spec, _, reports = moe
    report = json.loads((reports / "verify" / f"{spec['name']}_tiny-{spec['name']}.json").read_text())
    assert report["ok"], json.dumps(report, indent=2)[:3000]
    assert report["tool_probe"]["tool_calls"] == 1 and report["smoke"]["finish_reason"] == "stop"


def test_the_unit_on_the_host_loads_the_moe_gguf_with_its_experts_on_the_cpu(moe):
    spec, unit, _ = moe
    text = ssh(spec, f"cat /etc/systemd/system/{unit}").stdout
    assert re.search(r"--model /model/" + re.escape(MOE_FILE) + r"\b", text), text
    assert "--cpu-moe" in text and "--n-gpu-layers 999" in text, text
    assert ssh(spec, f"systemctl is-active {unit}").stdout.strip() == "active"


def test_the_servers_own_log_places_the_experts_tensors_in_cpu_memory(moe):
    spec, unit, _ = moe
    invocation = ssh(spec, f"systemctl show -p InvocationID --value {unit}").stdout.strip()
    assert invocation
    log = ssh(spec, f"journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID={invocation}").stdout
    assert re.search(rf"n_expert += {MOE_EXPERTS}\n", log), log[-3000:]  # the MoE GGUF is what loaded
    assert "tensor overrides to CPU are used with mmap enabled" in log, log[-3000:]
    overridden = dict(OVERRIDE.findall(log))  # llama.cpp logs each one twice (fitting, then loading)
    experts = {f"blk.{i}.ffn_{part}_exps.weight" for i in range(LAYERS) for part in ("gate", "up", "down")}
    assert set(overridden) == experts, overridden
    assert set(overridden.values()) == {"CPU"}, overridden
    assert "CPU_Mapped model buffer size" in log and "CUDA0 model buffer" not in log  # a CPU build: all host memory
