"""The IMEX stage (stages/imex.py) through pyinfra's @fake connector, with the pool's fabric the run context
would derive: fresh trays get the node list, the channel and the service; converged trays get nothing."""

import hashlib

from modelfleet.context import HostRun
from modelfleet.fabric import HostFabric, PoolFabric
from modelfleet.pipeline import run_stages
from modelfleet.stages import imex

HCAS = tuple(f"mlx5_{i}" for i in range(4))


def fabric(host: str, **extra) -> HostFabric:
    """A tray's RDMA fabric as the run context derives it (four HCAs on the rail's interface)."""
    ifname = "enP6p3s0f0np0"
    return HostFabric(host=host, ifname=ifname, head_address="192.168.40.1", hcas=HCAS, rdma=True,
                      env={"NCCL_SOCKET_IFNAME": f"={ifname}", "GLOO_SOCKET_IFNAME": ifname,
                           "NCCL_IB_HCA": "=" + ",".join(HCAS)},
                      devices=(*(f"/dev/infiniband/uverbs{i}" for i in range(4)), "/dev/infiniband/rdma_cm"), **extra)


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


def test_imex_on_fresh_trays_writes_the_node_list_makes_the_channel_and_starts_the_service(fake, uploads, monkeypatch):
    hosts = trays(monkeypatch)
    state = fake.run_fake(hosts, lambda: run_stages(imex))
    commands = fake.executed(state, "t2")
    assert uploads.files[imex.NODES_CONFIG] == "192.168.40.1\n192.168.40.2\n"
    assert "options nvidia NVreg_CreateImexChannel0=1" in uploads.files[imex.MODPROBE_CONF]
    assert any("mknod -m 666 /dev/nvidia-caps-imex-channels/channel0" in c for c in commands)
    assert commands[-2:] == ["systemctl enable nvidia-imex.service", "systemctl start nvidia-imex.service"]


def test_converged_imex_trays_get_no_commands(fake, monkeypatch):
    def file_line(content):
        return f"file 644 root root {hashlib.sha256(content.encode()).hexdigest()}"

    replies = {"@@modelfleet-state": [
        f"@@modelfleet-state path {imex.IMEX_DIR}", "dir 755 root root -",
        f"@@modelfleet-state path {imex.NODES_CONFIG}", file_line("192.168.40.1\n192.168.40.2\n"),
        f"@@modelfleet-state path {imex.MODPROBE_CONF}", file_line(imex.modprobe_conf()),
        f"@@modelfleet-state unit {imex.UNIT}", "ActiveState=active", "UnitFileState=enabled"]}
    hosts = [(n, {**d, "fake_responses": replies}) for n, d in trays(monkeypatch, channels=["channel0"])]
    state = fake.run_fake(hosts, lambda: run_stages(imex))
    host = state.inventory.get_host("@fake/t1")
    assert [state.get_op_meta(h).names for h in state.get_op_order()
            if state.get_op_data_for_host(host, h).operation_meta.did_change()] == []
    assert len(fake.executed(state, "t1")) == 1  # what is deployed (the channel came with the probe)
