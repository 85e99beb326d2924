"""Fabric doubles for the tests of the stages that use a pool's fabric (netcheck, imex): a member's fabric as
modelfleet.host.fabric derives it, and two GB300 trays whose run context gives theirs."""

from modelfleet.host.fabric import PoolFabric
from modelfleet.plan.inventory.plan import HostFabric
from modelfleet.run.context import HostRun

HCAS = tuple(f"mlx5_{i}" for i in range(8))


def fabric(host: str, rdma: bool = True, hcas=HCAS[:4], ifname: str = "enP6p3s0f0np0", **extra) -> HostFabric:
    devices = (*(f"/dev/infiniband/uverbs{i}" for i in range(len(hcas))), "/dev/infiniband/rdma_cm") if rdma else ()
    env = {"NCCL_SOCKET_IFNAME": f"={ifname}", "GLOO_SOCKET_IFNAME": ifname,
           **({"NCCL_IB_HCA": "=" + ",".join(hcas)} if rdma else {})}
    return HostFabric(host=host, ifname=ifname, head_address="192.168.40.1", hcas=hcas if rdma else (),
                      env=env, devices=devices, rdma=rdma, **extra)


def trays(monkeypatch, errors=(), channels=()):
    """Two GB300 trays of one pool; the run context gives their fabric, and their probes' IMEX channels."""
    names = ("@fake/t1", "@fake/t2")
    nodes = ("192.168.40.1", "192.168.40.2")
    fabrics = {n: fabric(n, imex=True, imex_nodes=nodes) for n in names}
    monkeypatch.setattr(HostRun, "fabric", lambda self, pool: PoolFabric(pool, hosts=fabrics, errors=list(errors)),
                        raising=False)
    monkeypatch.setattr(HostRun, "probe_on", lambda self, name: {"fabric": {"imex": {"channels": list(channels)}}},
                        raising=False)
    data = {"hardware": "gb300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": "e" * 40, "pool": "k31"}
    return [(n.split("/")[1], {**data, "ssh_hostname": f"10.0.0.{i + 1}"}) for i, n in enumerate(names)]
