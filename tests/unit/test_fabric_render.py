"""A pool member's fabric in its engine unit and env file (render.py): devices, IPC_LOCK and memlock where HCAs are
used, the derived environment in the 0600 env file, the head's fabric address in the engine's multi-node flags;
a service without a fabric renders exactly as before."""

from dataclasses import replace

from modelfleet.plan import render
from modelfleet.plan.inventory import resolve
from modelfleet.plan.inventory.plan import HostFabric

PIN = "e" * 40
IMEX_CHANNEL = "/dev/nvidia-caps-imex-channels/channel0"


def pool(data, hosts=("t1", "t2")):
    resolved = resolve([(h, {**data, "ssh_hostname": f"10.0.0.{i + 1}"}) for i, h in enumerate(hosts)])
    assert not resolved.errors, resolved.errors
    return [resolved.hosts[h].services[0] for h in hosts]


def gb300_pool(**extra):
    return pool({"hardware": "gb300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": PIN, "pool": "k31",
                 **extra})


def tray_fabric(host: str, rank: int) -> HostFabric:
    """A GB300 tray as the derivation gives it: 4 RoCE HCAs, the IMEX channel, the MNNVL environment."""
    hcas = ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3")
    return HostFabric(
        host=host, ifname="enP6p3s0f0np0", head_address="192.168.40.1", hcas=hcas,
        env={"NCCL_SOCKET_IFNAME": "=enP6p3s0f0np0", "GLOO_SOCKET_IFNAME": "enP6p3s0f0np0",
             "NCCL_IB_HCA": "=mlx5_0,mlx5_1,mlx5_2,mlx5_3", "VLLM_HOST_IP": f"192.168.40.{rank + 1}",
             "NCCL_MNNVL_ENABLE": "1", "NCCL_CUMEM_ENABLE": "1"},
        devices=(*(f"/dev/infiniband/uverbs{i}" for i in range(4)), "/dev/infiniband/rdma_cm", IMEX_CHANNEL),
        rdma=True, imex=True, imex_nodes=("192.168.40.1", "192.168.40.2"))


def test_the_tray_unit_carries_devices_caps_and_the_fabric_head():
    head, worker = gb300_pool()
    head, worker = replace(head, fabric=tray_fabric("t1", 0)), replace(worker, fabric=tray_fabric("t2", 1))
    argv = render.docker_run_argv(worker)
    image_at = argv.index(worker.image)
    docker = " ".join(argv[:image_at])
    assert ("--device nvidia.com/gpu=3 --device /dev/infiniband/uverbs0 --device /dev/infiniband/uverbs1 "
            "--device /dev/infiniband/uverbs2 --device /dev/infiniband/uverbs3 --device /dev/infiniband/rdma_cm "
            f"--device {IMEX_CHANNEL} --cap-add IPC_LOCK --ulimit memlock=-1 --env-file") in docker
    engine = " ".join(argv[image_at:])
    assert "--nnodes 2 --node-rank 1 --master-addr 192.168.40.1 --master-port 29500 --headless" in engine
    assert "10.0.0.1" not in " ".join(argv)  # never the SSH address once the fabric is known
    unit = render.render_unit(worker)
    assert "    --device /dev/infiniband/rdma_cm \\\n" in unit and "    --ulimit memlock=-1 \\\n" in unit
    assert "--master-addr 192.168.40.1" in render.render_unit(head)


def test_the_derived_environment_goes_to_the_0600_env_file_and_wins_over_the_inventory():
    _, worker = gb300_pool(nccl_socket_ifname="eth0")  # the inventory's value; the fabric checked and replaced it
    assert worker.env["NCCL_SOCKET_IFNAME"] == "eth0"
    env = render.render_env(replace(worker, fabric=tray_fabric("t2", 1)))
    lines = env.splitlines()
    assert lines[0].startswith("# Managed by modelfleet (mode 0600)")
    for line in ("NCCL_SOCKET_IFNAME==enP6p3s0f0np0", "GLOO_SOCKET_IFNAME=enP6p3s0f0np0",
                 "NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3", "VLLM_HOST_IP=192.168.40.2", "NCCL_MNNVL_ENABLE=1",
                 "NCCL_CUMEM_ENABLE=1", "VLLM_ENGINE_READY_TIMEOUT_S=3600"):
        assert line in lines
    assert "NCCL_SOCKET_IFNAME=eth0" not in lines
    assert lines[1:] == sorted(lines[1:])  # one order, so an unchanged fabric leaves the file unchanged


def test_without_a_fabric_every_file_is_byte_identical():
    for svc in [*gb300_pool(), *pool({"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm",
                                      "recipe": "tiny-lab-vllm-dp2", "pool": "dp"})]:
        assert svc.fabric is None
        unit, env = render.render_unit(svc), render.render_env(svc)
        assert render.render_unit(replace(svc, fabric=None)) == unit
        assert "--cap-add" not in unit and "/dev/infiniband" not in unit and "memlock" not in unit
        assert env == render.render_env(replace(svc, env=dict(svc.env)))
        assert render.rendezvous_address(svc) == svc.head_address == "10.0.0.1"


def test_a_socket_only_fabric_moves_the_head_address_and_adds_no_rdma():
    fabric = HostFabric(host="t2", ifname="eth1", head_address="172.16.0.1",
                        env={"NCCL_SOCKET_IFNAME": "=eth1", "GLOO_SOCKET_IFNAME": "eth1"})
    _, worker = pool({"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm-dp2",
                      "pool": "dp"})
    argv = render.docker_run_argv(replace(worker, fabric=fabric))
    assert "--data-parallel-address 172.16.0.1" in " ".join(argv)
    assert "--cap-add" not in argv and "--ulimit" not in argv
    assert render.fabric_flags(fabric) == [] and render.fabric_flags(None) == []


def test_sglang_takes_the_fabric_head_in_dist_init_addr():
    data = {"hardware": "b300", "model": "kimi-k3.1-pro", "engine": "sglang", "revision": PIN, "pool": "s"}
    svc = resolve([("b", data)]).hosts["b"].services[0]
    worker = replace(svc, nnodes=2, node_rank=1, head_address="10.0.0.1", fabric=tray_fabric("b", 1))
    assert render.multinode_args(worker) == ["--nnodes", "2", "--node-rank", "1", "--dist-init-addr",
                                             "192.168.40.1:29500"]


# /proc/devices lines as NVIDIA's IMEX guide shows them (docs.nvidia.com/multi-node-nvlink-systems/imex-guide/
# imexchannels.html: "234 nvidia-caps-imex-channels"), among the usual character devices.
PROC_DEVICES = "Character devices:\n  1 mem\n195 nvidia-frontend\n234 nvidia-caps-imex-channels\n235 nvidia-caps\n"


def run_channel_script(tmp_path, devices: str):
    """channel_script() in a real shell, on a /proc/devices of our own, with mknod replaced by a recorder."""
    import os
    import subprocess

    from modelfleet.run.stages import imex

    (tmp_path / "devices").write_text(devices)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "mknod").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/mknod.args\n')
    (tmp_path / "bin" / "mknod").chmod(0o755)
    script = imex.channel_script().replace("/proc/devices", str(tmp_path / "devices")).replace(
        imex.CHANNEL_DIR, str(tmp_path / "channels"))
    env = {**os.environ, "PATH": f"{tmp_path}/bin:{os.environ['PATH']}"}
    return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True)


def test_the_imex_channel_gets_the_major_the_driver_registered(tmp_path):
    done = run_channel_script(tmp_path, PROC_DEVICES)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "mknod.args").read_text() == f"-m 666 {tmp_path}/channels/channel0 c 234 0\n"
    assert (tmp_path / "channels").is_dir()


def test_no_imex_device_in_proc_devices_fails_saying_so(tmp_path):
    done = run_channel_script(tmp_path, "Character devices:\n195 nvidia-frontend\n")
    assert done.returncode == 1 and not (tmp_path / "mknod.args").exists()
    assert "registers no nvidia-caps-imex-channels device" in done.stderr


def test_the_imex_node_list_is_the_domains_fabric_addresses_in_pool_order():
    from modelfleet.run.stages import imex

    assert imex.nodes_config(tray_fabric("t2", 1)) == "192.168.40.1\n192.168.40.2\n"
    assert "options nvidia NVreg_CreateImexChannel0=1\n" in imex.modprobe_conf()
