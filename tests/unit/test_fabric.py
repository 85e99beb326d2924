"""A pool's fabric derived from its members' fabric facts (synthetic dumps built from public outputs, and the
H200 host's real capture), the faults refused with host and device named, the inventory's values checked, and
the same fabric in the preflight report through pyinfra's @fake connector."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelfleet.host import fabric as fab
from modelfleet.host.facts.fabric import parse_fabric
from modelfleet.plan.catalog import load_catalog
from modelfleet.plan.inventory.plan import HostPlan

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FABRIC = FIXTURES / "fabric"
H200 = FIXTURES / "gpu-hosts" / "h200x1-ubuntu2404"


def plan(name: str, hardware: str, address: str, **network_env) -> HostPlan:
    return HostPlan(name=name, address=f"ssh-{name}.example", hardware=load_catalog().hardware[hardware],
                    gpu_count=8, model_root="/srv/models", config_dir="/etc/modelfleet", hf_token_env="HF_TOKEN",
                    services=(), stack=None, fabric_address=address, network_env=network_env)


def fact(name: str, folder: Path = FABRIC) -> dict:
    return parse_fabric((folder / name).read_text().splitlines())


def b300_pool(worker: str = "b300-worker.txt", **worker_env) -> fab.PoolFabric:
    return fab.derive("k31", [(plan("b300-a", "b300", "10.0.0.11"), fact("b300-head.txt")),
                              (plan("b300-b", "b300", "10.0.0.12", **worker_env), fact(worker))])


RAILS = "=" + ",".join(f"mlx5_{i}:1" for i in range(10, 18))


def test_b300_pair_over_roce_rails():
    pool = b300_pool()
    assert pool.errors == [] and list(pool.hosts) == ["b300-a", "b300-b"]
    head, worker = pool.hosts["b300-a"], pool.hosts["b300-b"]
    assert worker.env == {"NCCL_SOCKET_IFNAME": "=bond0", "GLOO_SOCKET_IFNAME": "bond0",
                          "VLLM_HOST_IP": "10.0.0.12", "SGLANG_HOST_IP": "10.0.0.12", "NCCL_IB_HCA": RAILS,
                          "NCCL_IB_ADDR_FAMILY": "AF_INET", "NCCL_IB_ROCE_VERSION_NUM": "2"}
    assert head.env["NCCL_IB_HCA"] == worker.env["NCCL_IB_HCA"] and head.env["VLLM_HOST_IP"] == "10.0.0.11"
    assert "NCCL_IB_GID_INDEX" not in worker.env  # NCCL picks the GID itself
    assert worker.ifname == "bond0" and worker.head_address == head.head_address == "10.0.0.11"
    assert worker.hcas == tuple(f"mlx5_{i}" for i in range(10, 18))
    assert worker.devices == ("/dev/infiniband/rdma_cm", *(f"/dev/infiniband/uverbs{i}" for i in range(1, 9)))
    assert worker.rdma and not worker.imex and worker.imex_nodes == ()
    assert worker.reasons["ifname"] == "bond0 routes to head 10.0.0.11 (10.0.0.0/24 dev bond0)"
    assert head.reasons["ifname"] == "bond0 holds the head's address 10.0.0.11 (this host is the head)"
    assert "route group routes 10.224.0.0/16" in worker.reasons["NCCL_IB_HCA"]
    assert "mlx5_bond_0:1: another route group (frontend, Ethernet)" in worker.reasons["NCCL_IB_HCA"]
    assert set(worker.env) <= set(worker.reasons)
    assert worker.distances["0000:1a:00.0"]["mlx5_10"] == "PXB" and worker.distances["0000:1a:00.0"]["mlx5_14"] == "SYS"
    assert "mlx5_bond_0" not in worker.distances["0000:1a:00.0"]  # only the HCAs NCCL gets


def test_gb300_trays_get_imex_and_the_mnnvl_environment():
    pool = fab.derive("k3", [(plan("tray0", "gb300", "10.1.0.21"), fact("gb300-tray0.txt")),
                             (plan("tray1", "gb300", "10.1.0.22"), fact("gb300-tray1.txt"))])
    assert pool.errors == []
    tray = pool.hosts["tray1"]
    assert tray.imex and tray.imex_nodes == ("10.1.0.21", "10.1.0.22")
    assert tray.devices[-1] == "/dev/nvidia-caps-imex-channels/channel0"
    assert tray.env["NCCL_MNNVL_ENABLE"] == "1" and tray.env["NCCL_CUMEM_ENABLE"] == "1"
    assert tray.env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    assert tray.env["NCCL_SOCKET_IFNAME"] == "=enP8p1s0f0np0" and tray.env["VLLM_HOST_IP"] == "10.1.0.22"
    assert "channels channel0, service active" in tray.reasons["imex"]
    assert set(tray.env) <= set(tray.reasons)
    assert fab.nvlink_domain(load_catalog().hardware["gb300"])
    assert not any(fab.nvlink_domain(load_catalog().hardware[h]) for h in ("b300", "h100", "h200", "b200"))


def test_infiniband_h100_pair_read_without_iproute2():
    pool = fab.derive("ds", [(plan("h100-a", "h100", "10.3.0.31"), fact("h100-ib-0.txt")),
                             (plan("h100-b", "h100", "10.3.0.32"), fact("h100-ib-1.txt"))])
    assert pool.errors == []
    host = pool.hosts["h100-b"]
    assert host.env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_9:1,mlx5_10:1,mlx5_11:1"
    assert "NCCL_IB_ADDR_FAMILY" not in host.env  # InfiniBand: no RoCE GID to steer
    assert host.env["NCCL_SOCKET_IFNAME"] == "=ens7f0np0" and host.env["VLLM_HOST_IP"] == "10.3.0.32"
    reason = host.reasons["NCCL_IB_HCA"]
    assert "ib subnet fe80:0000:0000:0000" in reason and "mlx5_1:1: port 1 is DOWN" in reason


@pytest.mark.parametrize("worker,field,words", [
    ("b300-worker-port-down.txt", "NCCL_IB_HCA",
     ["7 usable HCAs", "b300-a has 8", "mlx5_13:1: port 1 is DOWN (physical state Disabled)"]),
    ("b300-worker-no-rocev2.txt", "NCCL_IB_HCA", ["mlx5_12 port 1 has no RoCE v2 GID"]),
    ("b300-worker-no-route.txt", "NCCL_SOCKET_IFNAME", ["no interface reaches head 10.0.0.11"]),
    ("b300-worker-7hca.txt", "NCCL_IB_HCA", ["7 usable HCAs", "mlx5_10, mlx5_11", "b300-a has 8 (not usable here: "
                                             "mlx5_17)", "no other HCA on this rail"]),
])
def test_faults_fail_the_pool_naming_host_and_device(worker, field, words):
    pool = b300_pool(worker)
    assert pool.hosts == {}
    assert len(pool.errors) == 1, pool.errors
    where, fld, message = pool.errors[0]
    assert (where, fld) == ("host b300-b", field)
    for word in words:
        assert word in message, message


def test_inventory_values_override_and_are_checked():
    pool = b300_pool(NCCL_SOCKET_IFNAME="=bond0")
    assert pool.hosts["b300-b"].env["NCCL_SOCKET_IFNAME"] == "=bond0"
    assert pool.hosts["b300-b"].reasons["NCCL_SOCKET_IFNAME"].startswith("from the inventory; checked: bond0 routes")
    missing = b300_pool(NCCL_SOCKET_IFNAME="=eth7").errors
    assert missing == [("host b300-b", "NCCL_SOCKET_IFNAME", "interface eth7 does not exist on this host (it has "
                        "bond0, enp193s0f0np0, gpu0rdma0, gpu1rdma0, gpu2rdma0, gpu3rdma0, gpu4rdma0, gpu5rdma0, "
                        "gpu6rdma0, gpu7rdma0, lo)")]
    astray = b300_pool(GLOO_SOCKET_IFNAME="gpu0rdma0").errors
    assert astray == [("host b300-b", "GLOO_SOCKET_IFNAME", "interface gpu0rdma0 does not reach head 10.0.0.11 "
                       "(its route is 10.0.0.0/24 dev bond0)")]
    hca = b300_pool(NCCL_IB_HCA="=mlx5_10:1,mlx5_99:1").errors
    assert ("host b300-b", "NCCL_IB_HCA", "HCA mlx5_99 does not exist on this host (it has mlx5_10, mlx5_11, "
            "mlx5_12, mlx5_13, mlx5_14, mlx5_15, mlx5_16, mlx5_17, mlx5_bond_0)") in hca
    down = b300_pool("b300-worker-port-down.txt", NCCL_IB_HCA="=mlx5_13:1").errors
    assert ("host b300-b", "NCCL_IB_HCA", "mlx5_13 port 1 is DOWN") in down
    fewer = b300_pool(NCCL_IB_HCA="=mlx5_10:1,mlx5_11:1").errors
    assert fewer == [("pool k31", "NCCL_IB_HCA", "members use different numbers of HCAs (NCCL pairs them by "
                      "position): b300-a 8, b300-b 2")]
    both = b300_pool(NCCL_SOCKET_IFNAME="=bond0", GLOO_SOCKET_IFNAME="gpu1rdma0").errors
    assert [e[1] for e in both] == ["GLOO_SOCKET_IFNAME"]
    prefix = b300_pool(NCCL_SOCKET_IFNAME="bond")  # NCCL's prefix form: bond0 matches
    assert prefix.errors == [] and prefix.hosts["b300-b"].env["NCCL_SOCKET_IFNAME"] == "bond"


def test_members_on_different_link_layers_fail_the_pool():
    pool = fab.derive("mixed", [(plan("b300-a", "b300", "10.0.0.11"), fact("b300-head.txt")),
                                (plan("h100-b", "h100", "10.0.0.31"), fact("h100-ib-0.txt"))])
    assert ("host h100-b", "NCCL_IB_HCA", "HCAs on InfiniBand, b300-a's on Ethernet") in pool.errors


def test_the_h200_host_alone_uses_sockets_over_its_virtio_nic():
    pool = fab.derive("solo", [(plan("h200", "h200", "192.0.2.2"), fact("fabric-probe.txt", H200))])
    host = pool.hosts["h200"]
    assert pool.errors == [] and host.ifname == "eth0" and host.hcas == () and not host.rdma
    assert host.devices == () and "NCCL_IB_HCA" not in host.env
    assert host.reasons["NCCL_IB_HCA"] == "no usable HCA (no other HCA on this rail): NCCL uses sockets over eth0"


def test_lab_hosts_on_loopback_addresses_reach_the_head_over_lo():
    pool = fab.derive("gate", [(plan("lab-1", "lab-cpu", "127.0.2.1"), fact("devbox-sysfs.txt")),
                               (plan("lab-2", "lab-cpu", "127.0.2.2"), fact("devbox-ip.txt"))])
    assert pool.hosts["lab-2"].env["NCCL_SOCKET_IFNAME"] == "=lo"
    assert pool.hosts["lab-2"].reasons["ifname"] == "lo routes to head 127.0.2.1 (127.0.0.0/8 dev lo)"


def test_a_member_without_a_fabric_fact_is_noted_not_guessed():
    pool = fab.derive("k31", [(plan("b300-a", "b300", "10.0.0.11"), fact("b300-head.txt")),
                              (plan("b300-b", "b300", "10.0.0.12"), None)])
    assert pool.hosts == {} and pool.errors == [] and pool.notes[0][:2] == ("host b300-b", "fabric")


def test_a_head_on_its_ssh_address_says_so():
    head = plan("b300-a", "b300", "10.0.0.11")
    head = HostPlan(**{**head.__dict__, "address": "10.0.0.11"})
    pool = fab.derive("k31", [(head, fact("b300-head.txt")),
                              (plan("b300-b", "b300", "10.0.0.12"), fact("b300-worker.txt"))])
    assert pool.hosts["b300-b"].reasons["head_address"] == \
        "10.0.0.11: b300-a's SSH address (the inventory sets no fabric_address), reached over bond0: set " \
        "fabric_address to the head's address on the pool network where it has one"
    assert b300_pool().hosts["b300-b"].reasons["head_address"] == \
        "10.0.0.11: b300-a's fabric_address (from the inventory), reached over bond0"


def test_a_head_without_an_ip_address_is_an_error():
    pool = fab.derive("k31", [(plan("b300-a", "b300", "head.example"), fact("b300-head.txt"))])
    assert pool.errors[0][:2] == ("host b300-a", "fabric_address")


def test_expected_without_facts():
    trays = [plan("tray0", "gb300", "10.1.0.21", NCCL_SOCKET_IFNAME="=enP8p1s0f0np0"),
             plan("tray1", "gb300", "10.1.0.22")]
    pool = fab.expected("k3", trays)
    t0, t1 = pool.hosts["tray0"], pool.hosts["tray1"]
    assert t0.ifname == "enP8p1s0f0np0" and t1.ifname is None
    assert t0.env == {"NCCL_SOCKET_IFNAME": "=enP8p1s0f0np0", **fab.MNNVL_ENV} and t1.env == fab.MNNVL_ENV
    assert t0.reasons["NCCL_SOCKET_IFNAME"] == "from the inventory"
    assert t1.reasons["NCCL_SOCKET_IFNAME"] == t1.reasons["NCCL_IB_HCA"] == "derived on the hosts at run time"
    assert t1.devices == (fab.IMEX_CHANNEL,) and t1.imex_nodes == ("10.1.0.21", "10.1.0.22")
    assert t1.head_address == "10.1.0.21"
    assert t1.reasons["head_address"] == "10.1.0.21: tray0's fabric_address (from the inventory)"
    from dataclasses import replace

    on_ssh = fab.expected("k3", [replace(p, fabric_address=p.address) for p in trays]).hosts["tray1"]
    assert on_ssh.head_address == "ssh-tray0.example"
    assert on_ssh.reasons["head_address"].startswith("ssh-tray0.example: tray0's SSH address (the inventory sets "
                                                     "no fabric_address)")
    b300 = fab.expected("k31", [plan("b300-a", "b300", "10.0.0.11")]).hosts["b300-a"]
    assert b300.env == {} and b300.devices == () and not b300.imex


def test_preflight_reports_the_pool_fabric_in_its_one_probe(fake, tmp_path, monkeypatch):
    """Two hosts of one pool: each probe carries its fabric part, and the preflight report the pool's fabric."""
    from modelfleet.run.pipeline import run_stages
    from modelfleet.run.stages import preflight

    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    pool = {"model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm-dp2", "pool": "pair", "hardware": "lab-cpu"}

    def host(address, dump):
        lines = (FABRIC / dump).read_text().splitlines()
        return {**pool, "ssh_hostname": f"192.0.2.{address[-2:]}", "fabric_address": address,
                "fake_responses": {"@@modelfleet-probe": fake.probe_reply({"fabric": lines})}}

    state = fake.run_fake([("b300-a", host("10.0.0.11", "b300-head.txt")),
                           ("b300-b", host("10.0.0.12", "b300-worker.txt"))],
                          lambda: run_stages(preflight))
    for name in ("b300-a", "b300-b"):
        probes = [c for c in fake.executed(state, name) if "@@modelfleet-probe" in c]
        assert len(probes) == 1 and "@@modelfleet-fabric" in probes[0]  # one read, fabric included
    report = json.loads((tmp_path / "preflight" / "_fake_b300-b.json").read_text())
    fabric = report["fabric"]["pair"]
    assert fabric["ok"] and fabric["hosts"]["@fake/b300-b"]["env"]["NCCL_IB_HCA"] == RAILS
    assert fabric["hosts"]["@fake/b300-b"]["reasons"]["ifname"] == ("bond0 routes to head 10.0.0.11 "
                                                                     "(10.0.0.0/24 dev bond0)")
    assert json.loads((tmp_path / "fabric" / "pair.json").read_text()) == fabric
