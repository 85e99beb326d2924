"""The fabric fact: the command run in a real shell, its output parsed from real captures (the 1x H200 host, the
development VM with and without iproute2), synthetic dumps built from public outputs, and the public tools'
outputs (ibstat, ibv_devinfo, show_gids, rdma link, nvidia-smi topo -m) that cross-check it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from modelfleet.base.host_commands import FABRIC_MARK, fabric_command
from modelfleet.host.facts import fabric as ff
from modelfleet.host.facts.probe import HostProbe
from tests.helpers import fabric_tools as tools
from tests.helpers.public_samples import public_sample_lines

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FABRIC = FIXTURES / "fabric"
H200 = FIXTURES / "gpu-hosts" / "h200x1-ubuntu2404"


def sample(name: str) -> list[str]:
    """A fixture's published text (its provenance header ends at the first `# ---` line)."""
    text = (FABRIC / name).read_text()
    return (text.split("# ---\n", 1)[1] if text.startswith("# ") else text).splitlines()


def fact(name: str, folder: Path = FABRIC) -> dict:
    return ff.parse_fabric((folder / name).read_text().splitlines())


def capture_sections(path: Path) -> dict[str, list[str]]:
    """The H200 capture's `## name` sections (its header ends at `# ---`)."""
    out: dict[str, list[str]] = {}
    current = None
    for line in path.read_text().split("# ---\n", 1)[1].splitlines():
        if line.startswith("## "):
            current = out.setdefault(line[3:], [])
        elif current is not None:
            current.append(line)
    return out


def test_h200_host_without_ip_is_read_from_sysfs_and_proc():
    f = fact("fabric-probe.txt", H200)
    assert f["source"] == "sysfs"
    eth0 = f["interfaces"]["eth0"]
    assert (eth0["mtu"], eth0["state"], eth0["pci"], eth0["virtual"]) == (1400, "up", "0000:00:03.0", False)
    assert eth0["device"] == "/sys/devices/pci0000:00/0000:00:03.0/virtio2"
    assert [a["address"] for a in eth0["addresses"]] == ["192.0.2.2", "fe80::fc:ff:fe00:1", "fd00::2"]
    assert eth0["addresses"][0]["prefixlen"] == 24
    assert {n for n, i in f["interfaces"].items() if i["virtual"]} == {"ifb0", "ifb1", "lo"}
    assert f["interfaces"]["lo"]["addresses"][0] == {"family": "inet", "address": "127.0.0.1", "prefixlen": 8}
    assert f["routes"] == [{"dst": "0.0.0.0/0", "dev": "eth0", "gateway": "192.0.2.1", "prefsrc": None, "metric": 0},
                           {"dst": "192.0.2.0/24", "dev": "eth0", "gateway": None, "prefsrc": None, "metric": 0},
                           {"dst": "fd00::/64", "dev": "eth0", "gateway": None, "prefsrc": None, "metric": 256},
                           {"dst": "fe80::/64", "dev": "eth0", "gateway": None, "prefsrc": None, "metric": 256},
                           {"dst": "::/0", "dev": "eth0", "gateway": "fd00::1", "prefsrc": None, "metric": 1024}]
    assert ff.route_to(f, "fd00::77")["src"] == "fd00::2"
    assert f["hcas"] == {} and f["dev_infiniband"] == ["rdma_cm"]
    assert f["gpus"] == {"0000:00:06.0": {"path": "/sys/devices/pci0000:00/0000:00:06.0", "numa": -1}}
    assert f["imex"] == {"channels": [], "active": None, "enabled": None, "nodes": []}
    assert f["modules"]["nvidia"] and not f["modules"]["nvidia_peermem"] and not f["modules"]["ib_uverbs"]
    assert ff.route_to(f, "192.0.2.77") == {"dev": "eth0", "dst": "192.0.2.0/24", "gateway": None,
                                            "src": "192.0.2.2", "local": False}
    assert ff.route_to(f, "198.51.100.9")["gateway"] == "192.0.2.1"
    assert ff.route_to(f, "192.0.2.2")["local"] and ff.route_to(f, "127.0.2.1")["dev"] == "lo"


def test_the_h200_capture_reads_section_by_section_like_the_command():
    """The team's capture of the same host (`## name` sections, other commands) agrees with the fact."""
    sec = capture_sections(H200 / "fabric.txt")
    assert sec["ip -j addr"] == ["ip: command not found"]  # why the fact reads sysfs there
    links = ff.parse_links(sec["/sys/class/net"])["/sys/class/net/"]
    probe = fact("fabric-probe.txt", H200)
    assert set(links) == set(probe["interfaces"])
    assert links["eth0"].rsplit("/net/", 1)[0] == probe["interfaces"]["eth0"]["device"]
    assert sec["/sys/class/net/eth0"][:2] == ["1400", "up"]  # mtu, operstate
    assert ff.parse_links(sec["infiniband"]) == {}  # no HCA
    assert ff.parse_listing(sec["infiniband"][-4:]) == ["rdma_cm"]  # /dev/infiniband
    imex = sec["imex"]
    assert "cannot access '/dev/nvidia-caps-imex-channels'" in imex[0]
    assert ff.parse_listing(imex[:1]) == []


def test_the_command_runs_in_a_shell_and_its_fallback_agrees_with_iproute2(tmp_path):
    """The real command on this machine: with `ip`, and with a PATH that lacks it (the H200's case)."""
    with_ip = subprocess.run(["sh", "-c", f"( {fabric_command()} ) 2>/dev/null"], capture_output=True, text=True)
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("sh", "cat", "ls", "grep", "cut"):
        found = subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        (tools / tool).symlink_to(found)
    without = subprocess.run([str(tools / "sh"), "-c", f"( {fabric_command()} ) 2>/dev/null"],
                             capture_output=True, text=True, env={"PATH": str(tools)})
    assert with_ip.returncode == 0 and without.returncode == 0
    a, b = ff.parse_fabric(with_ip.stdout.splitlines()), ff.parse_fabric(without.stdout.splitlines())
    assert b["source"] == "sysfs"
    if a["source"] != "ip":
        pytest.skip("this machine has no iproute2")
    assert_same_view(a, b)


def assert_same_view(a: dict, b: dict):
    def v4(f):
        return {n: sorted((x["address"], x["prefixlen"]) for x in i["addresses"] if x["family"] == "inet")
                for n, i in f["interfaces"].items()}

    def routes(f):
        return sorted((r["dst"], r["dev"], r["gateway"], r["metric"]) for r in f["routes"])

    assert v4(a) == v4(b) and routes(a) == routes(b)
    assert {n: (i["mtu"], i["pci"], i["virtual"]) for n, i in a["interfaces"].items()} == \
        {n: (i["mtu"], i["pci"], i["virtual"]) for n, i in b["interfaces"].items()}


def test_recorded_ip_and_sysfs_views_of_one_machine_agree():
    a, b = fact("devbox-ip.txt"), fact("devbox-sysfs.txt")
    assert (a["source"], b["source"]) == ("ip", "sysfs")
    assert_same_view(a, b)
    assert ff.route_to(a, "192.0.2.9") == ff.route_to(b, "192.0.2.9")
    assert ff.route_to(a, "fd00::9") == ff.route_to(b, "fd00::9")
    assert ff.route_to(b, "2001:db8::1")["gateway"] == "fd00::1"  # /proc/net/ipv6_route's default


def test_route_to_takes_the_longest_prefix_then_the_lowest_metric():
    f = fact("b300-head.txt")
    assert ff.route_to(f, "10.224.3.12")["dev"] == "gpu3rdma0"  # its rail's /24 beats the fabric's /16
    r = ff.route_to(f, "10.224.9.9")  # only the /16s cover it: eight routes, metrics 100..107
    assert (r["dev"], r["gateway"], r["src"]) == ("gpu0rdma0", "10.224.0.1", "10.224.0.11")
    assert ff.route_to(f, "10.0.0.12")["dev"] == "bond0"
    assert ff.route_to(f, "203.0.113.5")["dst"] == "0.0.0.0/0"
    assert ff.route_to(fact("b300-worker-no-route.txt"), "10.0.0.11") is None


def test_hcas_from_sysfs_ports_gids_and_pci():
    f = fact("b300-head.txt")
    hca = f["hcas"]["mlx5_13"]
    assert list(f["hcas"])[:3] == ["mlx5_10", "mlx5_11", "mlx5_12"] and list(f["hcas"])[-1] == "mlx5_bond_0"
    port = hca["ports"]["1"]
    assert (port["state"], port["phys_state"], port["link_layer"], port["rate"], port["pkey"]) == \
        ("ACTIVE", "LinkUp", "Ethernet", "400 Gb/sec (4X NDR)", "0xffff")
    assert port["gids"]["3"] == {"gid": "0000:0000:0000:0000:0000:ffff:0ae0:030b", "type": "RoCE v2",
                                 "ndev": "gpu3rdma0"}
    assert hca["netdevs"] == ["gpu3rdma0"] and hca["numa"] == 0 and hca["uverbs"] == "uverbs4"
    assert f["hcas"]["mlx5_bond_0"]["netdevs"] == ["enp193s0f0np0"]  # the bond's PCI function
    down = fact("b300-worker-port-down.txt")["hcas"]["mlx5_13"]["ports"]["1"]
    assert (down["state"], down["phys_state"]) == ("DOWN", "Disabled")
    assert {g["type"] for g in fact("b300-worker-no-rocev2.txt")["hcas"]["mlx5_12"]["ports"]["1"]["gids"].values()} \
        == {"IB/RoCE v1"}


@pytest.mark.parametrize("sample_name,dump", [("b300x8-nvidia-smi-topo-m-9nic.txt", "b300-head.txt")])
def test_pcie_distances_from_sysfs_match_nvidia_smi_topo(sample_name, dump):
    """Each GPU's distance to each HCA, from the PCI paths, is what the published `topo -m` of the board says."""
    topo = tools.topology_distances(public_sample_lines(sample_name))
    f = fact(dump)
    by_index = {str(i): f["distances"][pci] for i, pci in enumerate(sorted(f["gpus"]))}
    assert by_index == topo
    assert topo["0"]["mlx5_10"] == "PXB" and topo["0"]["mlx5_11"] == "NODE" and topo["0"]["mlx5_14"] == "SYS"


def test_pcie_distance_words():
    root = "/sys/devices/pci0000:00/0000:00:01.0"
    assert ff.pcie_distance(f"{root}/0000:01:00.0/0000:02:00.0/0000:03:00.0",
                            f"{root}/0000:01:00.0/0000:02:01.0/0000:04:00.0") == "PIX"
    assert ff.pcie_distance(f"{root}/0000:01:00.0", "/sys/devices/pci0000:00/0000:00:02.0/0000:05:00.0") == "PHB"
    assert ff.pcie_distance(f"{root}/0000:01:00.0", "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0", 0, 1) == "SYS"


def test_the_infiniband_h100_dump_agrees_with_its_ibstat():
    """The synthetic H100 dump carries the HCAs of the published ibstat: same states, link layers, rates."""
    ibstat = tools.parse_ibstat(public_sample_lines("nv18x8-ibstat-cx7-cx6dx.txt"))
    f = fact("h100-ib-0.txt")
    assert f["source"] == "sysfs" and set(f["hcas"]) == set(ibstat)
    for name, hca in f["hcas"].items():
        mine, theirs = hca["ports"]["1"], ibstat[name]["ports"]["1"]
        assert mine["state"].lower() == theirs["state"].lower(), name
        assert mine["phys_state"] == theirs["phys_state"] and mine["link_layer"] == theirs["link_layer"], name
        assert mine["rate"].split()[0] == theirs["rate"], name


def test_the_probe_carries_the_fabric_only_when_asked():
    assert FABRIC_MARK not in HostProbe().command()
    command = HostProbe().command(fabric=True)
    assert fabric_command() in command
    lines = ["@@modelfleet-probe fabric", *(H200 / "fabric-probe.txt").read_text().splitlines(),
             "@@modelfleet-probe rc=0"]
    assert HostProbe().process(lines)["fabric"] == fact("fabric-probe.txt", H200)


def test_the_whole_probe_run_in_a_shell_carries_the_fabric_part():
    """HostProbe's one command with the fabric part, run for real here (the GPU tools it lacks spoil only theirs)."""
    run = subprocess.run(["sh", "-c", HostProbe().command(fabric=True)], capture_output=True, text=True)
    probe = HostProbe().process(run.stdout.splitlines())
    assert probe["fabric"]["interfaces"] and probe["fabric"]["source"] in ("ip", "sysfs")
    assert probe["os"]["id"]  # the parts around it still read
