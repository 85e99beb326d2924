"""Fabric personas: the network and RDMA view of hosts with no recording (an 8x B300 with ConnectX RoCE
HCAs in two route groups and that board's worker with one fault each, a GB300 tray with IMEX, an InfiniBand
H100 host), each built from a public output (tests/fixtures/fabric/SOURCE says which).

One model per host, written two ways: as the files a lab host presents to modelfleet's real fabric command
(host_commands.fabric_command) — a sysfs-like tree for /sys/class, /sys/devices and /sys/bus, /dev/infiniband,
the IMEX channels, node list and service, and `ip -j`'s answers — and as what that command prints, the dumps
in tests/fixtures/fabric that the unit tests read (tests/fixtures/fabric/synthesize.py writes them from here).
`lab up --persona b300x8-roce-1-port-down` starts a host carrying one; tests/lab/test_fabric_faults_e2e.py
checks that the command on the lab host reads the same fact as the dump."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MARK = "@@modelfleet-fabric"
STAMP = "lrwxrwxrwx 1 root root 0 Dec  3 19:02"
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
GID_TABLE = 16  # a port's GID files in the tree (the kernel has more; the empty ones read as zero)


def mac(*parts: int) -> str:
    return ":".join(f"{p:02x}" for p in (0x58, 0xA2, 0xE1, *parts))


def v4_gid(address: str) -> str:
    raw = ipaddress.IPv6Address(f"::ffff:{address}").exploded
    return raw


def link_local_gid(mac_text: str) -> str:
    b = [int(x, 16) for x in mac_text.split(":")]
    eui = [b[0] ^ 2, b[1], b[2], 0xFF, 0xFE, b[3], b[4], b[5]]
    return "fe80:0000:0000:0000:" + ":".join(f"{eui[i]:02x}{eui[i + 1]:02x}" for i in range(0, 8, 2))


class Host:
    def __init__(self):
        self.ifaces: list[dict] = []  # ip -j addr items
        self.routes: list[dict] = []
        self.links: dict[str, list[tuple[str, str]]] = {}
        self.values: list[tuple[str, str]] = []
        self.gids: list[tuple[str, str]] = []
        self.imex: list[str] = ["service inactive "]
        self.imex_nodes: list[str] = []
        self.modules = ["nvidia", "ib_core", "ib_uverbs", "mlx5_ib", "rdma_ucm", "nvidia_peermem"]
        self.dev_ib = ["rdma_cm"]
        self.uverbs = 0
        # Only in the tree (the command does not print them): sysfs's `device` links of HCAs and netdevs, each
        # uverbs node's `ibdev`, and the empty GID entries.
        self.tree_links: list[tuple[str, str]] = []
        self.tree_files: list[tuple[str, str]] = []

    def iface(self, name, device, mtu, address=None, prefix=24, state="UP", mac_text="00:00:00:00:00:00",
              loopback=False):
        addr = []
        if address:
            addr.append({"family": "inet", "local": address, "prefixlen": prefix, "scope": "host" if loopback
                         else "global", "label": name, "valid_life_time": 4294967295,
                         "preferred_life_time": 4294967295})
        self.ifaces.append({"ifindex": len(self.ifaces) + 1, "ifname": name,
                            "flags": ["LOOPBACK", "UP", "LOWER_UP"] if loopback else
                            ["BROADCAST", "MULTICAST"] + (["UP", "LOWER_UP"] if state == "UP" else []),
                            "mtu": mtu, "qdisc": "mq", "operstate": "UNKNOWN" if loopback else state,
                            "group": "default", "txqlen": 1000, "link_type": "loopback" if loopback else "ether",
                            "address": mac_text, "broadcast": "ff:ff:ff:ff:ff:ff", "addr_info": addr})
        self.links.setdefault("/sys/class/net/", []).append(
            (name, f"../../devices/{device}/net/{name}" if device else f"../../devices/virtual/net/{name}"))
        if device:
            self.tree_links.append((f"/sys/devices/{device}/net/{name}/device", f"../../../{device.rsplit('/', 1)[1]}"))
        self.values += [(f"/sys/class/net/{name}/address", mac_text), (f"/sys/class/net/{name}/mtu", str(mtu)),
                        (f"/sys/class/net/{name}/operstate", "unknown" if loopback else state.lower())]

    def route(self, dst, dev, gateway=None, prefsrc=None, metric=None):
        item = {"dst": dst, "dev": dev}
        if gateway:
            item["gateway"] = gateway
        else:
            item.update({"protocol": "kernel", "scope": "link"})
        if prefsrc:
            item["prefsrc"] = prefsrc
        if metric is not None:
            item["metric"] = metric
        item["flags"] = []
        self.routes.append(item)

    def hca(self, name, device, layer, state="4: ACTIVE", phys="5: LinkUp", rate="400 Gb/sec (4X NDR)",
            netdev=None, mac_text=None, address=None, v2=True, numa=0, pkey="0xffff"):
        self.links.setdefault("/sys/class/infiniband/", []).append((name, f"../../devices/{device}/infiniband/{name}"))
        uv = f"uverbs{self.uverbs}"
        self.uverbs += 1
        self.links.setdefault("/sys/class/infiniband_verbs/", []).append(
            (uv, f"../../devices/{device}/infiniband_verbs/{uv}"))
        self.dev_ib.append(uv)
        function = device.rsplit("/", 1)[1]
        self.tree_links.append((f"/sys/devices/{device}/infiniband/{name}/device", f"../../../{function}"))
        self.tree_files.append((f"/sys/devices/{device}/infiniband_verbs/{uv}/ibdev", name))
        base = f"/sys/class/infiniband/{name}"
        self.values += [(f"{base}/device/numa_node", str(numa)), (f"{base}/ports/1/state", state),
                        (f"{base}/ports/1/phys_state", phys), (f"{base}/ports/1/link_layer", layer),
                        (f"{base}/ports/1/rate", rate), (f"{base}/ports/1/pkeys/0", pkey)]
        if layer == "InfiniBand":
            guid = mac_text.replace(":", "")
            self.gids.append((f"{base}/ports/1/gids/0", "fe80:0000:0000:0000:" +
                              ":".join(guid[i:i + 4] for i in range(0, 16, 4))))
            self.tree_files += [(f"{base}/ports/1/gids/{i}", ZERO_GID) for i in range(1, GID_TABLE)]
            return
        entries = [(link_local_gid(mac_text), "IB/RoCE v1"), (link_local_gid(mac_text), "RoCE v2")]
        if address:
            entries += [(v4_gid(address), "IB/RoCE v1"), (v4_gid(address), "RoCE v2")]
        for i, (gid, kind) in enumerate(entries):
            if kind == "RoCE v2" and not v2:
                kind = "IB/RoCE v1"
            self.gids.append((f"{base}/ports/1/gids/{i}", gid))
            self.values += [(f"{base}/ports/1/gid_attrs/types/{i}", kind),
                            (f"{base}/ports/1/gid_attrs/ndevs/{i}", netdev)]
        self.tree_files += [(f"{base}/ports/1/gids/{i}", ZERO_GID) for i in range(len(entries), GID_TABLE)]

    def gpu(self, device, numa):
        pci = device.rsplit("/", 1)[1]
        self.links.setdefault("/sys/bus/pci/drivers/nvidia/", []).append((pci, f"../../../../devices/{device}"))
        self.values.append((f"/sys/bus/pci/drivers/nvidia/{pci}/numa_node", str(numa)))

    def dump(self, ip: bool = True) -> str:
        """What the fabric command prints on this host (`ip`: False for a host without iproute2)."""
        out = []
        if ip:
            out += [f"{MARK} ip-addr", json.dumps(self.ifaces, separators=(",", ":")),
                    f"{MARK} ip-route", json.dumps(self.routes, separators=(",", ":")), f"{MARK} ip-route6", "[]"]
        else:
            out += [f"{MARK} proc-route", *self._proc_route(), f"{MARK} fib-trie", *self._fib_trie(),
                    f"{MARK} if-inet6"]
        out.append(f"{MARK} links")
        for where in ("/sys/bus/pci/drivers/nvidia/", "/sys/class/infiniband/", "/sys/class/infiniband_verbs/",
                      "/sys/class/net/"):
            out += [f"{where}:", "total 0"]
            out += [f"{STAMP} {name} -> {target}" for name, target in sorted(self.links.get(where, []))]
            out.append("")
        out.append(f"{MARK} values")
        out += [f"{p}:{v}" for p, v in self.values]
        out += [f"{p}:{v}" for p, v in self.gids]
        out += [f"{MARK} imex", *self.imex, f"{MARK} imex-nodes", *self.imex_nodes, f"{MARK} modules", *self.modules,
                f"{MARK} dev-infiniband", *self.dev_ib]
        return "\n".join(out) + "\n"

    def tree(self, root: Path) -> None:
        """The same host as files under `root`, which the lab mounts where the command reads them (see mounts):
        sys/ (class, devices, bus: the class and driver directories' links into devices/ as sysfs lays them out,
        the values and GIDs as files), dev-infiniband/, imex-channels/, nvidia-imex/nodes_config.cfg, systemd-wants/
        (nvidia-imex enabled where it is active) and ip-addr.json, ip-route.json, ip-route6.json (`ip -j`'s
        answers). The mounted folders are emptied and refilled, never replaced: a running host has them mounted."""
        for folder in MOUNTED:
            (root / folder).mkdir(parents=True, exist_ok=True)
            for child in (root / folder).iterdir():
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        links = [(f"{where}{name}", target) for where, items in self.links.items() for name, target in items]
        for path, target in links + self.tree_links:
            link = root / path.lstrip("/")
            (link.parent / target).resolve().mkdir(parents=True, exist_ok=True)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(target)
        for path, value in self.values + self.gids + self.tree_files:
            file = root / path.lstrip("/")  # through the links above, as the kernel resolves them
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(value + "\n")
        for name in self.dev_ib:
            (root / "dev-infiniband" / name).write_text("")
        for line in self.imex:
            if line.startswith("channel "):
                (root / "imex-channels" / line.split()[1]).write_text("")
        if self.imex_nodes:
            (root / "nvidia-imex" / "nodes_config.cfg").write_text("".join(f"{n}\n" for n in self.imex_nodes))
        if self.imex_service:
            (root / "systemd-wants" / "nvidia-imex.service").symlink_to("/etc/systemd/system/nvidia-imex.service")
        for name, value in (("ip-addr.json", self.ifaces), ("ip-route.json", self.routes), ("ip-route6.json", [])):
            (root / name).write_text(json.dumps(value) + "\n")

    @property
    def imex_service(self) -> bool:
        return "service active enabled" in self.imex

    def _proc_route(self) -> list[str]:
        def hx(address):
            return "".join(f"{b:02X}" for b in reversed(ipaddress.IPv4Address(address).packed))
        rows = ["Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"]
        for r in self.routes:
            net = ipaddress.ip_network("0.0.0.0/0" if r["dst"] == "default" else r["dst"])
            flags = "0003" if r.get("gateway") else "0001"
            rows.append(f"{r['dev']}\t{hx(net.network_address)}\t{hx(r.get('gateway') or '0.0.0.0')}\t{flags}\t0\t0\t"
                        f"{r.get('metric', 0)}\t{hx(net.netmask)}\t0\t0\t0")
        return rows

    def _fib_trie(self) -> list[str]:
        rows = ["Main:", "  +-- 0.0.0.0/0 3 0 5"]
        for item in self.ifaces:
            for a in item["addr_info"]:
                rows += [f"     |-- {a['local']}", "        /32 host LOCAL"]
        return rows


# The tree's folders the lab mounts into the host (lab/__init__.py start_host, through mounts()).
MOUNTED = ("sys/class", "sys/devices", "sys/bus", "dev-infiniband", "imex-channels", "nvidia-imex", "systemd-wants")


def b300(host_index: int, fault: str = "") -> Host:
    """8x B300 SXM6 AC as github.com/sgl-project/sglang/issues/26039 shows it: mlx5_10..17 one per GPU (PXB),
    mlx5_bond_0 on NUMA node 1; here the eight are RoCE rails 10.224.N.0/24 routed to 10.224.0.0/16, the bond
    the frontend (bond0, 10.0.0.0/24, the default route)."""
    h = Host()
    me = 11 + host_index
    h.iface("lo", None, 65536, "127.0.0.1", 8, loopback=True)
    bond_dev = "pci0000:c0/0000:c0:01.0/0000:c1:00.0"
    h.iface("bond0", None, 9000, f"10.0.0.{me}", 24, mac_text=mac(0x10, 0, me))
    h.route("default", "bond0", gateway="10.0.0.1") if fault != "no-route" else None
    h.route("10.0.0.0/24", "bond0", prefsrc=f"10.0.0.{me}") if fault != "no-route" else None
    h.hca("mlx5_bond_0", bond_dev, "Ethernet", rate="200 Gb/sec (2X NDR)", netdev="bond0",
          mac_text=mac(0x10, 0, me), address=f"10.0.0.{me}", numa=1)
    h.iface("enp193s0f0np0", bond_dev, 9000, mac_text=mac(0x10, 0, me))
    for i in range(8):
        if fault == "7hca" and i == 7:
            continue
        numa = 0 if i < 4 else 1
        rc = 0x15 + 0x20 * i
        root = f"pci0000:{rc:02x}/0000:{rc:02x}:01.0/0000:{rc + 1:02x}:00.0"
        nic = f"{root}/0000:{rc + 2:02x}:01.0/0000:{rc + 6:02x}:00.0"
        gpu = f"{root}/0000:{rc + 2:02x}:00.0/0000:{rc + 3:02x}:00.0/0000:{rc + 4:02x}:00.0/0000:{rc + 5:02x}:00.0"
        h.gpu(gpu, numa)
        netdev = f"gpu{i}rdma0"
        address = f"10.224.{i}.{me}"
        m = mac(0x20 + i, host_index, me)
        down = fault == "port-down" and i == 3
        h.iface(netdev, nic, 9000, address, 24, mac_text=m, state="DOWN" if down else "UP")
        h.route(f"10.224.{i}.0/24", netdev, prefsrc=address)
        h.route("10.224.0.0/16", netdev, gateway=f"10.224.{i}.1", metric=100 + i)
        h.hca(f"mlx5_{10 + i}", nic, "Ethernet", netdev=netdev, mac_text=m, address=address, numa=numa,
              state="1: DOWN" if down else "4: ACTIVE", phys="3: Disabled" if down else "5: LinkUp",
              v2=not (fault == "no-rocev2" and i == 2))
    return h


def gb300(tray: int) -> Host:
    """One GB300 NVL72 compute tray: 4 GPUs, 4 ConnectX-8 (RoCE), IMEX channel 0 and service up, node list of
    both trays."""
    h = Host()
    me = 21 + tray
    h.iface("lo", None, 65536, "127.0.0.1", 8, loopback=True)
    eth = "pci0008:00/0008:00:00.0/0008:01:00.0"
    h.iface("enP8p1s0f0np0", eth, 1500, f"10.1.0.{me}", 24, mac_text=mac(0x30, tray, me))
    h.route("default", "enP8p1s0f0np0", gateway="10.1.0.1")
    h.route("10.1.0.0/24", "enP8p1s0f0np0", prefsrc=f"10.1.0.{me}")
    for i in range(4):
        nic = f"pci{i:04x}:00/{i:04x}:00:00.0/{i:04x}:01:00.0/{i:04x}:02:00.0/{i:04x}:03:00.0"
        gpu = f"pci{i + 8:04x}:00/{i + 8:04x}:00:00.0/{i + 8:04x}:01:00.0"
        h.gpu(gpu, i // 2)
        netdev = f"enP{i}p3s0f0np0"
        address = f"10.2.{i}.{me}"
        m = mac(0x40 + i, tray, me)
        h.iface(netdev, nic, 9000, address, 24, mac_text=m)
        h.route(f"10.2.{i}.0/24", netdev, prefsrc=address)
        h.route("10.2.0.0/16", netdev, gateway=f"10.2.{i}.1", metric=100 + i)
        h.hca(f"mlx5_{i}", nic, "Ethernet", rate="800 Gb/sec (4X XDR)", netdev=netdev, mac_text=m, address=address,
              numa=i // 2)
    h.imex = ["channel channel0", "service active enabled"]
    h.imex_nodes = ["10.1.0.21", "10.1.0.22"]
    return h


def h100(host_index: int) -> Host:
    """8x H100 with the HCAs of github.com/kvcache-ai/Mooncake/issues/2039's ibstat: ConnectX-7 InfiniBand
    (mlx5_0,3,4,5,6,9,10,11, Active, 400), ConnectX-6 Dx Ethernet (mlx5_1,2 Down; mlx5_7,8 Active, 100); the
    control network on mlx5_7's port (ens7f0np0)."""
    h = Host()
    me = 31 + host_index
    h.iface("lo", None, 65536, "127.0.0.1", 8, loopback=True)
    ib = [0, 3, 4, 5, 6, 9, 10, 11]
    for n, i in enumerate(ib):
        nic = f"pci0000:{0x10 * n + 0x10:02x}/0000:{0x10 * n + 0x10:02x}:01.0/0000:{0x10 * n + 0x11:02x}:00.0"
        h.hca(f"mlx5_{i}", nic, "InfiniBand", mac_text=f"a0:88:c2:03:00:{n:02x}:{host_index:02x}:{i:02x}",
              numa=0 if n < 4 else 1)
        h.iface(f"ib{n}", nic, 2044, f"192.168.{n}.{me}", 24, mac_text=f"00:00:10:{n:02x}:{host_index:02x}:{i:02x}")
        h.route(f"192.168.{n}.0/24", f"ib{n}")
    for i, state in ((1, "down"), (2, "down"), (7, "up"), (8, "up")):
        nic = (f"pci0000:e0/0000:e0:01.0/0000:e1:00.{i % 2}" if i in (7, 8)
               else f"pci0000:d0/0000:d0:01.0/0000:d1:00.{i % 2}")
        netdev = {1: "ens1f0np0", 2: "ens1f1np1", 7: "ens7f0np0", 8: "ens7f1np1"}[i]
        m = mac(0x50 + i, host_index, me)
        address = f"10.3.0.{me}" if i == 7 else (f"10.4.0.{me}" if i == 8 else None)
        h.iface(netdev, nic, 1500, address, 24, mac_text=m, state=state.upper())
        h.hca(f"mlx5_{i}", nic, "Ethernet", state="4: ACTIVE" if state == "up" else "1: DOWN",
              phys="5: LinkUp" if state == "up" else "3: Disabled",
              rate="100 Gb/sec (4X EDR)" if state == "up" else "40 Gb/sec (4X QDR)", netdev=netdev, mac_text=m,
              address=address, numa=1)
        if address:
            h.route(address.rsplit(".", 1)[0] + ".0/24", netdev)
    h.route("default", "ens7f0np0", gateway="10.3.0.1")
    for n in range(8):
        rc = 0x10 * n + 0x10
        h.gpu(f"pci0000:{rc:02x}/0000:{rc:02x}:02.0/0000:{rc + 2:02x}:00.0", 0 if n < 4 else 1)
    return h


@dataclass(frozen=True)
class Persona:
    """A lab persona carrying a fabric: its GPUs, the persona whose GPU recordings it replays (None: it has no
    GPU recordings, only the fabric), its pool's first member, the address its tree holds on the network that
    reaches that member (the inventory's fabric_address), and its dump in tests/fixtures/fabric."""

    hardware: str
    gpus: int
    recordings: str | None
    head: str
    address: str
    fixture: str
    build: Callable[[], Host]
    ip: bool = True  # the fixture's form; False: as a host without iproute2 prints it (/proc/net). The lab host
    # always answers `ip -j` (it shares the machine's network namespace, so /proc/net is the machine's).


def _b300(fault: str = "") -> Persona:
    name = f"b300-worker-{fault}.txt" if fault else "b300-worker.txt"
    return Persona("b300", 8, "b300x8-synthetic", "b300x8-roce-0", "10.0.0.12", name, lambda: b300(1, fault))


PERSONAS: dict[str, Persona] = {
    "b300x8-roce-0": Persona("b300", 8, "b300x8-synthetic", "b300x8-roce-0", "10.0.0.11", "b300-head.txt",
                             lambda: b300(0)),
    "b300x8-roce-1": _b300(),
    # The worker with one fault each: an HCA port down, an HCA without a RoCE v2 GID, no route that reaches
    # the head, one HCA fewer than its peer.
    **{f"b300x8-roce-1-{fault}": _b300(fault) for fault in ("port-down", "no-rocev2", "no-route", "7hca")},
    **{f"gb300x4-imex-{tray}": Persona("gb300", 4, None, "gb300x4-imex-0", f"10.1.0.{21 + tray}",
                                       f"gb300-tray{tray}.txt", lambda tray=tray: gb300(tray)) for tray in (0, 1)},
    **{f"h100x8-ib-{i}": Persona("h100", 8, None, "h100x8-ib-0", f"10.3.0.{31 + i}", f"h100-ib-{i}.txt",
                                 lambda i=i: h100(i), ip=False) for i in (0, 1)},
}


def build(name: str, out: Path, base: Path | None) -> Path:
    """Persona `name` under `out`: the recordings of its base persona (`base`, written in place) and its fabric
    tree in out/fabric."""
    out.mkdir(parents=True, exist_ok=True)
    for recording in base.iterdir() if base else ():
        (out / recording.name).write_text(recording.read_text())
    host = PERSONAS[name].build()
    # Rewritten only when the model changed: a running host reads the tree while `lab up` starts others.
    stamp = hashlib.sha256(repr((host.dump(), host.tree_links, host.tree_files, MOUNTED)).encode()).hexdigest()
    if (out / "fabric" / "built").exists() and (out / "fabric" / "built").read_text() == stamp:
        return out
    host.tree(out / "fabric")
    (out / "fabric" / "built").write_text(stamp)
    return out


def mounts(recordings: Path, personas: Path) -> list[str]:
    """Where a fabric persona's tree goes in its lab host (docker -v, the host's own mount namespace; the
    machine's /sys is not touched): /sys/class, /sys/devices and /sys/bus (the rest of /sys stays the kernel's,
    /sys/fs/cgroup too), /dev/infiniband, the IMEX channels and node list, nvidia-imex enabled where the persona
    runs it (a stand-in unit), and an `ip` that answers `ip -j` from the persona."""
    tree = recordings / "fabric"
    out = [f"{tree / 'sys' / part}:/sys/{part}:ro" for part in ("class", "devices", "bus")]
    out += [f"{tree / 'dev-infiniband'}:/dev/infiniband:ro", f"{personas / 'ip'}:/usr/local/bin/ip:ro"]
    if os.listdir(tree / "imex-channels"):
        out.append(f"{tree / 'imex-channels'}:/dev/nvidia-caps-imex-channels:ro")
    if os.listdir(tree / "nvidia-imex"):  # read-write: the imex stage keeps the node list
        out.append(f"{tree / 'nvidia-imex'}:/etc/nvidia-imex")
    if os.listdir(tree / "systemd-wants"):
        out += [f"{personas / 'nvidia-imex.service'}:/etc/systemd/system/nvidia-imex.service:ro",
                f"{tree / 'systemd-wants'}:/etc/systemd/system/graphical.target.wants:ro"]
    return out
