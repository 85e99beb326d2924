"""The public tools' outputs (ibstat, ibv_devinfo, show_gids, rdma link, nvidia-smi topo -m's NIC legend) parsed
from published samples (tests/helpers/fabric_tools.py); test_facts_fabric holds them against the fabric fact."""

from __future__ import annotations

from pathlib import Path

from modelfleet.host.rails import gid_families
from tests.helpers import fabric_tools as tools
from tests.helpers.public_samples import public_sample_lines

FABRIC = Path(__file__).resolve().parents[1] / "fixtures" / "fabric"


def sample(name: str) -> list[str]:
    """A fixture's published text (its provenance header ends at the first `# ---` line)."""
    text = (FABRIC / name).read_text()
    return (text.split("# ---\n", 1)[1] if text.startswith("# ") else text).splitlines()


def test_nic_legend_of_topo_m():
    assert tools.parse_nic_legend(public_sample_lines("b300x8-nvidia-smi-topo-m-9nic.txt"))["NIC8"] == "mlx5_bond_0"
    legend = tools.parse_nic_legend(public_sample_lines("nv18x8-nvidia-smi-topo-m-12nic-spaces.txt"))
    assert len(legend) == 12 and legend["NIC11"] == "mlx5_11"


def test_ibstat_public_samples():
    b300 = tools.parse_ibstat(public_sample_lines("b300x7-ibstat-cx8-down.txt"))
    assert b300["mlx5_0"]["ports"]["1"] == {"state": "Down", "phys_state": "Disabled", "rate": "10", "lid": "65535",
                                            "link_layer": "InfiniBand"}
    assert b300["mlx5_0"]["type"] == "MT4131" and b300["mlx5_2"]["ports"]["1"]["state"] == "Active"
    assert sum(p["state"] == "Active" for c in b300.values() for p in c["ports"].values()) == 4


def test_ibv_devinfo_public_excerpts():
    down = tools.parse_ibv_devinfo(sample("ibv-devinfo-cx7-ib-port-down-excerpt.txt"))
    assert down["mlx5_0"]["ports"]["1"] == {"gids": {}, "state": "DOWN", "link_layer": "InfiniBand"}
    assert down["mlx5_1"]["ports"] == {}  # the excerpt ends before its port block
    # The -v excerpt starts at the port block: it is read as the port of one HCA.
    roce = tools.parse_ibv_devinfo(["hca_id: mlx5_0", *sample("ibv-devinfo-v-roce-port-excerpt.txt")])
    port = roce["mlx5_0"]["ports"]["1"]
    assert (port["state"], port["phys_state"], port["link_layer"]) == ("ACTIVE", "LinkUp", "Ethernet")
    assert port["gids"] == {"14": {"gid": "0000:0000:0000:0000:0000:ffff:c0a8:0606"},
                            "15": {"gid": "0000:0000:0000:0000:0000:ffff:c0a8:0606"}}


def test_show_gids_public_samples_and_their_address_families():
    rows = tools.parse_show_gids(sample("show-gids-cx6-ens1f0.txt"))
    assert len(rows) == 6 and rows[5] == {"dev": "mlx5_0", "port": "1", "index": "5",
                                          "gid": "0000:0000:0000:0000:0000:ffff:ac13:003c", "ipv4": "172.19.0.60",
                                          "version": "v2", "netdev": "ens1f0"}
    assert tools.parse_show_gids(sample("show-gids-empty-pod.txt")) == []
    mi355 = tools.parse_show_gids(sample("show-gids-mi355-rocep-excerpt.txt"))
    assert len(mi355) == 10 and mi355[8]["version"] == "v1" and mi355[8]["netdev"] == "enp193s0f0np0"

    def port(rows, dev):
        return {"gids": {r["index"]: {"gid": r["gid"], "type": "RoCE v2" if r["version"] == "v2" else "IB/RoCE v1"}
                         for r in rows if r["dev"] == dev}}

    # NCCL_IB_ADDR_FAMILY follows the RoCE v2 GIDs: IPv4-mapped on the ConnectX-6, global IPv6 on the MI355 NICs.
    assert gid_families(port(rows, "mlx5_0")) == {"AF_INET"}
    assert gid_families(port(mi355, "rocep105s0")) == {"AF_INET6"}


def test_rdma_link_public_sample():
    assert tools.parse_rdma_link(sample("rdma-link-cx6dx.txt")) == {
        "mlx5_0/1": {"state": "ACTIVE", "phys_state": "LINK_UP", "netdev": "p1p1"},
        "mlx5_1/1": {"state": "ACTIVE", "phys_state": "LINK_UP", "netdev": "p1p2"}}
