"""Kimi K3 over two 8xB300 hosts (kimi-k3-vllm-dep16-b300: data parallel 16, expert parallel), rendered with the
fabric derived from the synthetic B300 RoCE dumps (tests/fixtures/fabric/b300-*.txt) as a run attaches it to each
member (fabric_run.as_run): the RDMA devices, IPC_LOCK and memlock in the unit, NCCL's interface and HCAs in the
0600 env file, and the head's fabric address as vLLM's data-parallel address."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from modelfleet.host import fabric as fab
from modelfleet.host.facts.fabric import parse_fabric
from modelfleet.plan import render
from modelfleet.plan.inventory import resolve

FABRIC = Path(__file__).resolve().parents[1] / "fixtures" / "fabric"
PIN = "d" * 40
RAILS = ",".join(f"mlx5_{i}:1" for i in range(10, 18))


def dep16_pool(worker_dump: str = "b300-worker.txt"):
    """The two hosts as an inventory gives them (SSH on a management network, the pool on the frontend bond),
    and the pool's fabric derived from each member's dump, head first."""
    data = {"hardware": "b300", "model": "kimi-k3", "engine": "vllm", "recipe": "kimi-k3-vllm-dep16-b300",
            "pool": "k3", "revision": PIN}
    resolved = resolve([("b300-a", {**data, "ssh_hostname": "192.0.2.11", "fabric_address": "10.0.0.11"}),
                        ("b300-b", {**data, "ssh_hostname": "192.0.2.12", "fabric_address": "10.0.0.12"})])
    assert resolved.errors == [], resolved.errors
    dumps = {"b300-a": "b300-head.txt", "b300-b": worker_dump}
    pool = fab.derive("k3", [(resolved.hosts[name], parse_fabric((FABRIC / dumps[name]).read_text().splitlines()))
                             for name in resolved.pools["k3"].hosts])
    return resolved, pool


def members():
    resolved, pool = dep16_pool()
    assert pool.errors == []
    return [replace(resolved.hosts[name].services[0], fabric=pool.hosts[name]) for name in ("b300-a", "b300-b")]


def test_each_member_runs_its_eight_data_parallel_ranks_against_the_heads_fabric_address():
    head, worker = members()
    engine = " ".join(render.engine_argv(head))
    assert ("--data-parallel-size 16 --data-parallel-size-local 8 --data-parallel-address 10.0.0.11 "
            "--data-parallel-rpc-port 13345") in engine
    assert "--enable-expert-parallel" in engine and "--headless" not in engine
    assert " ".join(render.engine_argv(worker)).endswith(
        "--data-parallel-address 10.0.0.11 --data-parallel-rpc-port 13345 --headless --data-parallel-start-rank 8")
    for svc in (head, worker):
        argv = render.docker_run_argv(svc)
        assert not any("192.0.2." in arg for arg in argv)  # never the SSH address
        assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.85"


def test_the_unit_carries_the_rdma_devices_ipc_lock_and_memlock():
    _, worker = members()
    argv = render.docker_run_argv(worker)
    docker = " ".join(argv[:argv.index(worker.image)])
    gpus = " ".join(f"--device nvidia.com/gpu={i}" for i in range(8))
    rdma = " ".join(f"--device /dev/infiniband/{d}" for d in ("rdma_cm", *(f"uverbs{i}" for i in range(1, 9))))
    assert f"{gpus} {rdma} --cap-add IPC_LOCK --ulimit memlock=-1 --env-file /etc/modelfleet/k3.env" in docker
    unit = render.render_unit(worker)
    for line in ("    --device /dev/infiniband/rdma_cm \\\n", "    --device /dev/infiniband/uverbs8 \\\n",
                 "    --cap-add IPC_LOCK \\\n", "    --ulimit memlock=-1 \\\n",
                 "    --data-parallel-address 10.0.0.11 \\\n"):
        assert line in unit, line


def test_the_env_file_holds_the_derived_interface_hcas_and_host_address():
    head, worker = members()
    for svc, own in ((head, "10.0.0.11"), (worker, "10.0.0.12")):
        lines = render.render_env(svc).splitlines()
        for line in ("NCCL_SOCKET_IFNAME==bond0", "GLOO_SOCKET_IFNAME=bond0", f"NCCL_IB_HCA=={RAILS}",
                     "NCCL_IB_ADDR_FAMILY=AF_INET", "NCCL_IB_ROCE_VERSION_NUM=2", f"VLLM_HOST_IP={own}",
                     "VLLM_USE_V2_MODEL_RUNNER=1"):
            assert line in lines, (svc.host, line)
        # Not a prefill/decode server: no KV transfer settings.
        assert not any(line.startswith(("VLLM_NIXL_", "UCX_")) for line in lines)
    assert render.fabric_env(worker) == worker.fabric.env  # the gate's container gets the same


def test_a_member_without_a_roce_v2_gid_fails_the_pool_naming_host_and_hca():
    _, pool = dep16_pool("b300-worker-no-rocev2.txt")
    assert pool.hosts == {}
    assert [(where, fld) for where, fld, _ in pool.errors] == [("host b300-b", "NCCL_IB_HCA")]
    assert "mlx5_12" in pool.errors[0][2]
