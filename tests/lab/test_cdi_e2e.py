"""CDI for real (#29): a lab host with a Docker that has CDI (Debian forky's dockerd, lab/cdi.py) and the spec its
nvidia-ctk wrote for its 8 GPUs' device nodes serves two pools, one GPU each, through the units' own
`--device nvidia.com/gpu=N`. Inside each engine container: its GPU's node and the common ones, no other GPU's, and
the device cgroup agrees (a node of its own GPU opens as far as the missing driver, ENXIO; one of another GPU made
inside the container is refused, EPERM). `systemctl daemon-reload` on the host leaves the running containers
and their GPUs as they were, and the unit restarted after it gets its GPU again."""

import json
import os
import shlex
import time

import pytest

import lab
from modelfleet import REPO_ROOT
from modelfleet.base.commands import run_modelfleet, run_pyinfra

pytestmark = pytest.mark.lab

GPUS = 8
# Run in an engine container: each /dev/nvidia* node (major, minor, what an open gets), and what an open gets on a
# node made here for each GPU (195:N): the device cgroup lets through only the container's own.
PROBE = r"""
import errno, json, os, sys
def tried(path):
    try:
        os.close(os.open(path, os.O_RDWR))
        return "opened"
    except OSError as e:
        return errno.errorcode[e.errno]
nodes = {}
for name in sorted(os.listdir("/dev")):
    if name.startswith("nvidia"):
        rdev = os.stat("/dev/" + name).st_rdev
        nodes[name] = [os.major(rdev), os.minor(rdev), tried("/dev/" + name)]
made = {}
for i in range(int(sys.argv[1])):
    path = "/tmp/modelfleet-cdi-probe"
    os.mknod(path, 0o20600, os.makedev(195, i))
    made[str(i)] = tried(path)
    os.unlink(path)
print(json.dumps({"nodes": nodes, "made": made}))
"""
COMMON = {"nvidia-modeset": [195, 254], "nvidia-uvm": [509, 0], "nvidia-uvm-tools": [509, 1], "nvidiactl": [195, 255]}


@pytest.fixture(scope="module")
def served(lab_hosts, tmp_path_factory):
    """An 8x B300 (pre-built persona) on a Docker with CDI joins the session's lab, serving pair-a and pair-b."""
    personas = [s["persona"] for s in lab_hosts] + ["b300x8-synthetic"]
    name = f"{lab.PREFIX}{len(personas)}"
    spec = lab.up(len(personas), personas=personas, disks=1, cdi_hosts=[name])[-1]
    env = {**os.environ, "MODELFLEET_REPORTS": str(tmp_path_factory.mktemp("cdi") / "reports")}
    with lab.scenario.applied(only=[name], two_pools=name):
        run = run_pyinfra("inventories/lab.py", "deploys/serve.py", cwd=REPO_ROOT, env=env, timeout=600)
        assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
        status = run_modelfleet("status", "inventories/lab.py", "--json", cwd=REPO_ROOT, env=env)
    row = next(r for r in json.loads(status.stdout) if r["host"] == name)
    yield spec, env, {s["pool"]: s for s in row["services"]}
    lab.remove([name])


def on_host(spec: dict, command: str) -> str:
    done = lab.ssh(spec, command)
    assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
    return done.stdout


def container(spec: dict, pool: str) -> dict:
    """The pool's engine container as the host's own dockerd shows it."""
    data = json.loads(on_host(spec, f"docker inspect -f '{{{{json .}}}}' modelfleet-{pool}-{spec['name']}"))
    return {"id": data["Id"], "image": data["Config"]["Image"], "started": data["State"]["StartedAt"],
            "running": data["State"]["Running"],
            "devices": data["HostConfig"].get("Devices") or [],
            "requests": [(r["Driver"], r["DeviceIDs"]) for r in data["HostConfig"].get("DeviceRequests") or []]}


def probe(spec: dict, pool: str) -> dict:
    return json.loads(on_host(spec, f"docker exec modelfleet-{pool}-{spec['name']} python3 -c "
                                    f"{shlex.quote(PROBE)} {GPUS}"))


def expected(gpu: int) -> dict:
    nodes = {f"nvidia{gpu}": [195, gpu, "ENXIO"], **{n: [*mm, "ENXIO"] for n, mm in COMMON.items()}}
    return {"nodes": nodes, "made": {str(i): "ENXIO" if i == gpu else "EPERM" for i in range(GPUS)}}


def test_the_host_runs_a_docker_with_cdi_and_the_spec_its_nvidia_ctk_wrote(served):
    spec, _, _ = served
    version = on_host(spec, "docker version --format '{{.Server.Version}}'").strip()
    assert int(version.split(".")[0]) >= 25, version  # Docker's first release with CDI device requests
    devices = json.loads(on_host(spec, "docker info --format '{{json .DiscoveredDevices}}'"))
    assert {d["ID"] for d in devices} == {f"nvidia.com/gpu={i}" for i in [*range(GPUS), "all"]}
    written = on_host(spec, "cat /etc/cdi/nvidia.yaml")
    assert written.startswith("---\ncdiVersion: ") and "kind: nvidia.com/gpu" in written
    assert f"hostPath: {spec['home']}/dev/nvidia7\n      path: /dev/nvidia7" in written
    assert on_host(spec, "ls /dev | grep -c '^nvidia[0-9]'").strip() == str(GPUS)  # the host has its 8 GPUs
    # Every GPU, as the DCGM exporter's unit and the GPU stack's container check ask for them.
    image = container(spec, "pair-a")["image"]
    listed = on_host(spec, f"docker run --rm --device nvidia.com/gpu=all --entrypoint ls {image} /dev").split()
    assert sorted(n for n in listed if n.startswith("nvidia")) == sorted([f"nvidia{i}" for i in range(GPUS)]
                                                                         + [*COMMON])


def test_each_pool_sees_only_its_own_gpu(served):
    spec, _, services = served
    assert {p: (s["gpu_indices"], s["state"]) for p, s in services.items()} == {
        "pair-a": ([0], "active/running"), "pair-b": ([1], "active/running")}
    for pool, gpu in (("pair-a", 0), ("pair-b", 1)):
        shown = container(spec, pool)
        assert shown["requests"] == [("cdi", [f"nvidia.com/gpu={gpu}"])] and shown["devices"] == []
        assert probe(spec, pool) == expected(gpu), pool


def test_a_units_gpus_survive_daemon_reload_and_a_restart(served):
    spec, _, services = served
    before = container(spec, "pair-a")
    on_host(spec, "systemctl daemon-reload")
    time.sleep(3)  # the container keeps running
    unit = services["pair-a"]["unit"]
    assert on_host(spec, f"systemctl is-active {unit}").strip() == "active"
    assert container(spec, "pair-a") == before
    assert probe(spec, "pair-a") == expected(0)
    on_host(spec, f"systemctl restart {unit}")  # a new container, from the same unit
    deadline = time.time() + 60
    while time.time() < deadline:
        shown = lab.ssh(spec, f"docker inspect -f '{{{{.Id}}}}' modelfleet-pair-a-{spec['name']}").stdout.strip()
        if shown and shown != before["id"]:
            break
        time.sleep(0.5)
    after = container(spec, "pair-a")
    assert after["id"] != before["id"] and after["requests"] == before["requests"]
    assert probe(spec, "pair-a") == expected(0)
    assert probe(spec, "pair-b") == expected(1)  # its neighbour untouched
