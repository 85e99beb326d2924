"""Round 5's pool faults on real lab hosts (real systemd, the lab's nvidia-smi stand-in in the host): a GPU still
held after its engine unit stopped (vLLM #57650) is named, with its process, before anything starts on it, and
is no longer named once the process is gone. The stage that runs the check is tested through pyinfra's fake
connector (tests/stages/test_service.py); the other classes of docs/operations.md "When a pool will not start"
are tested there and in tests/unit."""

import time

import pytest

import lab
from modelfleet.base import host_commands

pytestmark = pytest.mark.lab

UNIT = "modelfleet-heldgpu.service"
HELD = "/run/modelfleet-lab/compute-apps"


def test_a_gpu_held_after_its_engine_stopped_is_named_and_freed_by_killing_the_process(lab_hosts, monkeypatch):
    spec = lab_hosts[0]  # an h200x1 persona: GPU 0, as its recorded nvidia-smi says
    monkeypatch.setattr(host_commands, "GPU_RELEASE_WAIT_S", 3)
    uuid = lab.ssh(spec, "nvidia-smi --query-gpu=index,uuid --format=csv,noheader").stdout.split(", ")[1].strip()
    assert uuid.startswith("GPU-")
    # An engine unit runs; when it stops, its EngineCore (here: the lab's state) still holds the GPU's memory.
    assert lab.ssh(spec, f"systemd-run --unit={UNIT} sleep 600").returncode == 0
    assert lab.ssh(spec, f"mkdir -p /run/modelfleet-lab && echo '48213, VLLM::EngineCore, {uuid}, 104000' > "
                         f"{HELD}").returncode == 0
    start = time.monotonic()
    run = lab.ssh(spec, host_commands.gpus_free_script(UNIT, [0], stop=True))
    named = time.monotonic() - start
    try:
        assert run.returncode == 1, run.stdout + run.stderr
        assert run.stderr.strip() == (f"modelfleet: {UNIT} stopped but its GPUs are still held: GPU 0: pid 48213 "
                                      "(VLLM::EngineCore) holds 104000 MiB: not starting an engine on top of it "
                                      "(kill the process, or reset the GPU, then re-run)")
        assert lab.ssh(spec, f"systemctl is-active {UNIT}").stdout.strip() in ("inactive", "failed")
        assert named < 15, named  # the wait (3 s here, 20 s in a run) and the SSH round trip
        print(f"fault to line: {named:.1f} s")
        lab.ssh(spec, f"rm -f {HELD}")  # the operator killed it: the plain re-run finds the GPU free
        again = lab.ssh(spec, host_commands.gpus_free_script(UNIT, [0], stop=False))
        assert again.returncode == 0 and again.stdout.strip() == "free: GPUs 0"
    finally:
        lab.ssh(spec, f"rm -f {HELD}; systemctl stop {UNIT}; systemctl reset-failed {UNIT}")
