"""An engine that died can leave a process holding GPU memory (vLLM #57650): before a unit (re)starts, its old
engine is stopped and the GPUs it held must be free. host_commands.gpus_free_script run for real against the
lab's nvidia-smi stand-in (the B300 persona), whose per-process query serves a dead process's held memory."""

import os
import stat
import subprocess
from pathlib import Path

import pytest

from modelfleet.base import host_commands

LAB = Path(__file__).resolve().parents[2] / "lab" / "personas"
UUID = "GPU-5f1e0000-0000-4000-8000-00000000000{}"


@pytest.fixture
def gpu_host(tmp_path, monkeypatch):
    """A PATH whose nvidia-smi is the lab's stand-in and whose systemctl records what it was asked."""
    bin_dir, run = tmp_path / "bin", tmp_path / "run"
    bin_dir.mkdir(), run.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(LAB / "nvidia-smi")
    systemctl = bin_dir / "systemctl"
    systemctl.write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path / 'systemctl.log'}\n")
    systemctl.chmod(systemctl.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(host_commands, "GPU_RELEASE_WAIT_S", 1)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "MODELFLEET_LAB_RUN": str(run),
           "MODELFLEET_LAB_PERSONA": str(LAB / "b300x8-synthetic")}

    def run_check(stop: bool, gpus=(0, 1)):
        script = host_commands.gpus_free_script("modelfleet-tiny.service", gpus, stop)
        return subprocess.run(script, shell=True, env=env, capture_output=True, text=True)

    return run_check, run / "compute-apps", tmp_path / "systemctl.log"


def test_free_gpus_let_the_unit_start_and_a_held_one_is_named_and_refused(gpu_host):
    run_check, apps, asked = gpu_host
    free = run_check(stop=True)
    assert free.returncode == 0 and free.stdout.strip() == "free: GPUs 0 1"
    assert asked.read_text() == "stop modelfleet-tiny.service\n"  # the old engine first
    # The engine's EngineCore outlived it on GPU 1; another service's process on GPU 3 is not this unit's.
    apps.write_text(f"48213, VLLM::EngineCore, {UUID.format(1)}, 104000\n"
                    f"51000, python3, {UUID.format(3)}, 2000\n")
    held = run_check(stop=False)
    assert held.returncode == 1 and asked.read_text() == "stop modelfleet-tiny.service\n"
    assert held.stderr.strip() == (
        "modelfleet: modelfleet-tiny.service stopped but its GPUs are still held: GPU 1: pid 48213 "
        "(VLLM::EngineCore) holds 104000 MiB: not starting an engine on top of it (kill the process, or reset "
        "the GPU, then re-run)")
    assert run_check(stop=False, gpus=(0, 2)).returncode == 0  # GPU 3's process is no concern of GPUs 0 and 2
    apps.unlink()  # the operator killed it: the plain re-run starts the engine
    assert run_check(stop=False).returncode == 0
