"""Two pools on one host (#17): each service gets its own GPUs, and changing one pool's unit leaves the other's
container alone (same container, same start, same device requests). On the lab the GPUs are a recorded 8-GPU
persona and the machine's Docker has no CDI (20.10), so the indices are checked as planned, rendered and
reported; the device requests of a running container are checked to be unchanged, not to hold the GPUs."""

import json
import os
import subprocess

import pytest

from modelfleet import REPO_ROOT
from modelfleet.base.commands import run_modelfleet, run_pyinfra

pytestmark = pytest.mark.lab


def env_for(tmp_path) -> dict:
    return {**os.environ, "MODELFLEET_REPORTS": str(tmp_path / "reports")}


def container(pool: str, host: str) -> dict:
    shown = subprocess.run(["docker", "inspect", "-f", "{{json .}}", f"modelfleet-{pool}-{host}"],
                           capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    return {"id": data["Id"], "started": data["State"]["StartedAt"],
            "devices": [data["HostConfig"].get("Devices"), data["HostConfig"].get("DeviceRequests")]}


def test_two_pools_get_disjoint_gpus_and_a_change_to_one_leaves_the_other_running(pair_host, tmp_path, scenario):
    name = pair_host["name"]
    scenario(only=[name], two_pools=name)
    first = run_pyinfra("inventories/lab.py", "deploys/serve.py", cwd=REPO_ROOT, env=env_for(tmp_path),
                        timeout=600)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    status = run_modelfleet("status", "inventories/lab.py", "--json", cwd=REPO_ROOT, env=env_for(tmp_path))
    row = next(r for r in json.loads(status.stdout) if r["host"] == name)
    assert {s["pool"]: s["gpu_indices"] for s in row["services"]} == {"pair-a": [0], "pair-b": [1]}
    assert {s["pool"]: s["state"] for s in row["services"]} == {"pair-a": "active/running",
                                                                "pair-b": "active/running"}
    rendered = run_modelfleet("render", "inventories/lab.py", name, cwd=REPO_ROOT,
                              env=env_for(tmp_path))
    assert rendered.returncode == 0 and "--gpus" not in rendered.stdout
    a_before, b_before = container("pair-a", name), container("pair-b", name)

    scenario(only=[name], two_pools=name, pair_b_env={"LAB_NOTE": "b"})
    changed = run_pyinfra("inventories/lab.py", "deploys/serve.py", cwd=REPO_ROOT,
                          env=env_for(tmp_path), timeout=600)
    assert changed.returncode == 0, (changed.stdout + changed.stderr)[-4000:]
    assert container("pair-a", name) == a_before  # not restarted, not recreated, same devices
    b_after = container("pair-b", name)
    assert b_after["id"] != b_before["id"] and b_after["devices"] == b_before["devices"]
