"""The fabric fact: a host's network and RDMA view, read in one remote command (host_commands.fabric_command).
The parsers of the public tools that print the same view, which cross-check it, are the tests'
(tests/helpers/fabric_tools.py).

The fact is JSON (it goes into the preflight report): interfaces with their addresses, the IPv4/IPv6 route
table, HCAs with their ports and GID tables, GPUs' and HCAs' PCI paths and each GPU's PCIe distance to each
HCA, IMEX's state, the RDMA kernel modules and /dev/infiniband. `ip -j` is read where the host has it, else
/sys/class/net and /proc/net (hosts without iproute2). Ports and GID indexes are string keys."""

from __future__ import annotations

import ipaddress
import json
import posixpath
import re
import socket
import struct
from collections.abc import Iterable

from pyinfra.api import FactBase

from modelfleet.base.host_commands import FABRIC_MARK, FABRIC_MODULES, ZERO_GID, fabric_command

PCI_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


def sections(lines: Iterable[str]) -> dict[str, list[str]]:
    """The command's output cut at its `@@modelfleet-fabric NAME` lines."""
    out: dict[str, list[str]] = {}
    current = None
    for line in lines:
        if line.startswith(FABRIC_MARK):
            current = out.setdefault(line[len(FABRIC_MARK):].strip(), [])
        elif current is not None:
            current.append(line)
    return out


def parse_links(lines: Iterable[str]) -> dict[str, dict[str, str]]:
    """`ls -l DIR...`: each directory's symlinks as absolute paths (dir -> name -> target). One directory
    without a `DIR:` header is read as `/sys/class/net/`."""
    out: dict[str, dict[str, str]] = {}
    where = "/sys/class/net/"
    for line in lines:
        line = line.rstrip()
        if line.endswith(":") and line.startswith("/"):
            where = line[:-1].rstrip("/") + "/"
            continue
        m = re.search(r"\s(\S+) -> (\S+)$", line)
        if m:
            target = m.group(2)
            path = target if target.startswith("/") else posixpath.normpath(posixpath.join(where, target))
            out.setdefault(where, {})[m.group(1)] = path
    return out


# The files the command reads: a PCI address in the path and a GID in the value both hold colons, so the path
# ends at the first file name of these.
_VALUE = re.compile(r"(/\S*?/(?:address|mtu|operstate|numa_node|state|phys_state|link_layer|rate"
                    r"|(?:gids|types|ndevs|pkeys)/\d+)):(.*)")


def parse_values(lines: Iterable[str]) -> dict[str, str]:
    """`grep -H . FILE...`: path -> content."""
    out = {}
    for line in lines:
        m = _VALUE.fullmatch(line.rstrip("\n"))
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def parse_listing(lines: Iterable[str]) -> list[str]:
    """Names from `ls` or `ls -la` of one directory (an error line or `.`/`..` is not a name)."""
    names = []
    for line in lines:
        line = line.strip()
        if not line or line.startswith("total ") or line.endswith(":") or "cannot access" in line:
            continue
        name = line.split()[-1]
        if name not in (".", ".."):
            names.append(name)
    return names


def parse_ip_addr(text: str) -> dict[str, dict]:
    """`ip -j addr`: interface -> mac, mtu, state, flags, addresses."""
    out = {}
    for item in json.loads(text or "[]"):
        out[item["ifname"]] = {
            "mac": item.get("address"), "mtu": item.get("mtu"), "state": (item.get("operstate") or "").lower(),
            "loopback": "LOOPBACK" in item.get("flags", []) or item.get("link_type") == "loopback",
            "addresses": [{"family": a["family"], "address": a["local"], "prefixlen": a["prefixlen"]}
                          for a in item.get("addr_info", []) if a.get("family") in ("inet", "inet6")]}
    return out


def parse_ip_route(text: str, family: str = "inet") -> list[dict]:
    """`ip -j route` (or `ip -j -6 route`): destination, device, gateway, source, metric."""
    out = []
    for item in json.loads(text or "[]"):
        dst = item.get("dst", "")
        if dst == "default":
            dst = "0.0.0.0/0" if family == "inet" else "::/0"
        elif "/" not in dst:
            dst += "/32" if family == "inet" else "/128"
        out.append({"dst": dst, "dev": item.get("dev"), "gateway": item.get("gateway"),
                    "prefsrc": item.get("prefsrc"), "metric": item.get("metric", 0)})
    return out


def _hex_ipv4(text: str) -> str:
    return socket.inet_ntoa(struct.pack("<I", int(text, 16)))


def parse_proc_route(lines: Iterable[str]) -> list[dict]:
    """/proc/net/route (IPv4, little-endian hex; the header names the columns)."""
    rows = [line.split() for line in lines if line.strip()]
    if not rows or rows[0][0] != "Iface":
        return []
    col = {name: i for i, name in enumerate(rows[0])}
    out = []
    for row in rows[1:]:
        mask = ipaddress.IPv4Address(_hex_ipv4(row[col["Mask"]]))
        prefix = bin(int(mask)).count("1")
        gateway = _hex_ipv4(row[col["Gateway"]])
        out.append({"dst": f"{_hex_ipv4(row[col['Destination']])}/{prefix}", "dev": row[col["Iface"]],
                    "gateway": None if gateway == "0.0.0.0" else gateway, "prefsrc": None,
                    "metric": int(row[col["Metric"]])})
    return out


def parse_proc_route6(lines: Iterable[str]) -> list[dict]:
    """/proc/net/ipv6_route, without the kernel's local, multicast and reject entries (as `ip -6 route` shows
    the main table)."""
    out = []
    for line in lines:
        cells = line.split()
        if len(cells) != 10 or len(cells[0]) != 32:
            continue
        flags = int(cells[8], 16)
        dst = ipaddress.IPv6Network((int(cells[0], 16), int(cells[1], 16)))
        if flags & 0x80000000 or flags & 0x0200 or dst.is_multicast:
            continue
        gateway = ipaddress.IPv6Address(int(cells[4], 16))
        out.append({"dst": str(dst), "dev": cells[9], "gateway": None if int(gateway) == 0 else str(gateway),
                    "prefsrc": None, "metric": int(cells[5], 16)})
    return out


def parse_fib_trie(lines: Iterable[str]) -> list[str]:
    """The host's own IPv4 addresses: /proc/net/fib_trie's `/32 host LOCAL` leaves."""
    found, last = [], None
    for line in lines:
        m = re.match(r"\s*[|+]-- (\d+\.\d+\.\d+\.\d+)", line)
        if m:
            last = m.group(1)
        elif "/32 host LOCAL" in line and last and last not in found:
            found.append(last)
    return found


def parse_if_inet6(lines: Iterable[str]) -> dict[str, list[dict]]:
    """/proc/net/if_inet6: interface -> IPv6 addresses."""
    out: dict[str, list[dict]] = {}
    for line in lines:
        cells = line.split()
        if len(cells) == 6 and len(cells[0]) == 32:
            address = str(ipaddress.IPv6Address(int(cells[0], 16)))
            out.setdefault(cells[5], []).append({"family": "inet6", "address": address,
                                                 "prefixlen": int(cells[2], 16)})
    return out


def _addresses_from_routes(local: list[str], routes: list[dict], names: Iterable[str]) -> dict[str, list[dict]]:
    """Without `ip`: each own IPv4 address on the interface of the connected route that holds it
    (loopback addresses on the loopback interface)."""
    out: dict[str, list[dict]] = {}
    for addr in local:
        ip = ipaddress.ip_address(addr)
        if ip.is_loopback:
            dev = "lo" if "lo" in names else None
            prefix = 8
        else:
            best = max((r for r in routes if not r["gateway"] and r["dst"] != "0.0.0.0/0"
                        and ip in ipaddress.ip_network(r["dst"], strict=False)),
                       key=lambda r: ipaddress.ip_network(r["dst"], strict=False).prefixlen, default=None)
            dev, prefix = (best["dev"], int(best["dst"].split("/")[1])) if best else (None, 32)
        if dev:
            out.setdefault(dev, []).append({"family": "inet", "address": addr, "prefixlen": prefix})
    return out


def _pci_of(path: str | None) -> str | None:
    """The last PCI address in a sysfs device path (a virtio or net child sits below its PCI function)."""
    found = PCI_ADDRESS.findall(path or "")
    return found[-1] if found else None


def pci_chain(path: str) -> tuple[str, list[str]]:
    """(root complex `pciDDDD:BB`, the PCI functions from the root port down) of a sysfs device path."""
    parts = [p for p in path.split("/") if p]
    root = next((p for p in parts if p.startswith("pci")), "")
    return root, [p for p in parts if PCI_ADDRESS.fullmatch(p)]


def pcie_distance(a: str, b: str, numa_a: int | None = None, numa_b: int | None = None) -> str:
    """nvidia-smi topo's words for the PCIe path between two devices: PIX (one switch), PXB (several switches),
    PHB (through the host bridge), NODE (host bridges of one NUMA node), SYS (across NUMA nodes). A switch
    shows in sysfs as an upstream and a downstream port: two functions per level below the common one."""
    root_a, chain_a = pci_chain(a)
    root_b, chain_b = pci_chain(b)
    if not chain_a or not chain_b:
        return "unknown"
    if root_a != root_b:
        return "NODE" if numa_a == numa_b else "SYS"
    common = 0
    for x, y in zip(chain_a[:-1], chain_b[:-1], strict=False):
        if x != y:
            break
        common += 1
    if common == 0:
        return "PHB"
    switches = 1 + (len(chain_a) - common - 1) // 2 + (len(chain_b) - common - 1) // 2
    return "PIX" if switches == 1 else "PXB"


def _state(text: str | None) -> str | None:
    """'4: ACTIVE' -> 'ACTIVE', '5: LinkUp' -> 'LinkUp'."""
    return text.split(":", 1)[1].strip() if text and ":" in text else text


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def parse_fabric(lines: Iterable[str]) -> dict:
    """The fabric command's output as the fabric fact."""
    sec = sections(lines)
    links = parse_links(sec.get("links", []))
    values = parse_values(sec.get("values", []))
    net_links = links.get("/sys/class/net/", {})
    if "ip-addr" in sec:
        source = "ip"
        interfaces = parse_ip_addr("\n".join(sec["ip-addr"]))
        routes = parse_ip_route("\n".join(sec.get("ip-route", []))) + \
            parse_ip_route("\n".join(sec.get("ip-route6", [])), family="inet6")
    else:
        source = "sysfs"
        routes = parse_proc_route(sec.get("proc-route", [])) + parse_proc_route6(sec.get("proc-route6", []))
        names = set(net_links) | {p.split("/")[4] for p in values if p.startswith("/sys/class/net/")}
        v4 = _addresses_from_routes(parse_fib_trie(sec.get("fib-trie", [])), [r for r in routes if "." in r["dst"]],
                                    names)
        v6 = parse_if_inet6(sec.get("if-inet6", []))
        interfaces = {}
        for name in sorted(names):
            interfaces[name] = {"mac": values.get(f"/sys/class/net/{name}/address"),
                                "mtu": _int(values.get(f"/sys/class/net/{name}/mtu")),
                                "state": values.get(f"/sys/class/net/{name}/operstate", ""),
                                "loopback": name == "lo", "addresses": v4.get(name, []) + v6.get(name, [])}
    for name, info in interfaces.items():
        target = net_links.get(name)
        virtual = not target or "/devices/virtual/" in target
        info["device"] = None if virtual else target.rsplit("/net/", 1)[0]
        info["virtual"] = virtual
        info["pci"] = _pci_of(info["device"])
    hcas = _hcas(links.get("/sys/class/infiniband/", {}), values, interfaces)
    for name, target in links.get("/sys/class/infiniband_verbs/", {}).items():
        for hca in hcas.values():
            if hca["path"] and target.startswith(hca["path"] + "/infiniband_verbs/"):
                hca["uverbs"] = name
    gpus = {}
    for name, target in links.get("/sys/bus/pci/drivers/nvidia/", {}).items():
        if PCI_ADDRESS.fullmatch(name):
            gpus[name] = {"path": target, "numa": _int(values.get(f"/sys/bus/pci/drivers/nvidia/{name}/numa_node"))}
    distances = {gpu: {hca: pcie_distance(g["path"], h["path"], g["numa"], h["numa"]) for hca, h in hcas.items()
                       if h.get("path")} for gpu, g in gpus.items()}
    imex = sec.get("imex", [])
    service = next((line.split()[1:] for line in imex if line.startswith("service")), [])
    return {
        "source": source, "interfaces": interfaces, "routes": routes, "hcas": hcas, "gpus": gpus,
        "distances": distances,
        "imex": {"channels": [line.split(None, 1)[1] for line in imex if line.startswith("channel ")],
                 "active": service[0] if service else None, "enabled": service[1] if len(service) > 1 else None,
                 "nodes": [line.strip() for line in sec.get("imex-nodes", [])
                           if line.strip() and not line.lstrip().startswith("#")]},
        "modules": {m: m in {line.strip() for line in sec.get("modules", [])} for m in FABRIC_MODULES},
        "dev_infiniband": parse_listing(sec.get("dev-infiniband", [])),
    }


def _hcas(links: dict[str, str], values: dict[str, str], interfaces: dict[str, dict]) -> dict[str, dict]:
    """HCAs from /sys/class/infiniband: PCI path, NUMA node, netdevs, and per port its state, link layer,
    rate, partition key and the non-empty GIDs with their type and netdev."""
    names = set(links) | {p.split("/")[4] for p in values if p.startswith("/sys/class/infiniband/")}
    out = {}
    for name in sorted(names, key=natural_key):
        target = links.get(name)
        path = target.rsplit("/infiniband/", 1)[0] if target and "/infiniband/" in target else None
        pci = _pci_of(path)
        base = f"/sys/class/infiniband/{name}"
        ports: dict[str, dict] = {}
        for key, value in values.items():
            m = re.fullmatch(re.escape(base) + r"/ports/(\d+)/(.+)", key)
            if not m:
                continue
            port = ports.setdefault(m.group(1), {"gids": {}})
            rest = m.group(2)
            if rest in ("state", "phys_state"):
                port[rest] = _state(value)
            elif rest in ("link_layer", "rate"):
                port[rest] = value
            elif rest == "pkeys/0":
                port["pkey"] = value
            elif g := re.fullmatch(r"gids/(\d+)", rest):
                if value != ZERO_GID:
                    port["gids"].setdefault(g.group(1), {})["gid"] = value
            elif g := re.fullmatch(r"gid_attrs/(types|ndevs)/(\d+)", rest):
                port["gids"].setdefault(g.group(2), {})["type" if g.group(1) == "types" else "ndev"] = value
        for port in ports.values():
            port["gids"] = {i: gid for i, gid in sorted(port["gids"].items(), key=lambda kv: int(kv[0]))
                            if gid.get("gid")}
        netdevs = sorted(n for n, i in interfaces.items() if pci and i.get("pci") == pci)
        out[name] = {"pci": pci, "path": path, "uverbs": None, "numa": _int(values.get(f"{base}/device/numa_node")),
                     "netdevs": netdevs, "ports": dict(sorted(ports.items(), key=lambda kv: int(kv[0])))}
    return out


def natural_key(name: str) -> tuple:
    """mlx5_2 before mlx5_10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def route_to(fact: dict, address: str) -> dict | None:
    """The route the host takes to `address` (longest prefix, then lowest metric) as {dev, dst, gateway,
    src}; an own address or a loopback one goes over its interface (the kernel's local table)."""
    ip = ipaddress.ip_address(address)
    family = "inet" if ip.version == 4 else "inet6"
    interfaces = fact.get("interfaces") or {}
    for name, info in interfaces.items():
        for a in info.get("addresses", []):
            if a["family"] == family and ipaddress.ip_address(a["address"]) == ip:
                return {"dev": name, "dst": f"{address}/{ip.max_prefixlen}", "gateway": None, "src": address,
                        "local": True}
    if ip.is_loopback:
        lo = next((n for n, i in interfaces.items() if i.get("loopback")), None)
        if lo:
            return {"dev": lo, "dst": "127.0.0.0/8" if ip.version == 4 else "::1/128", "gateway": None,
                    "src": "127.0.0.1" if ip.version == 4 else "::1", "local": True}
    best = None
    for route in fact.get("routes") or []:
        net = ipaddress.ip_network(route["dst"], strict=False)
        if net.version != ip.version or ip not in net:
            continue
        key = (net.prefixlen, -(route.get("metric") or 0))
        if best is None or key > best[0]:
            best = (key, route)
    if best is None:
        return None
    route = best[1]
    return {"dev": route["dev"], "dst": route["dst"], "gateway": route.get("gateway"),
            "src": route.get("prefsrc") or source_address(fact, route["dev"], ip, route.get("gateway")),
            "local": False}


def source_address(fact: dict, dev: str, towards, gateway: str | None = None) -> str | None:
    """The interface's address the kernel would send from: one in the same subnet as the destination (or its
    gateway), else the interface's first global address of that family."""
    family = "inet" if towards.version == 4 else "inet6"
    addresses = [a for a in ((fact.get("interfaces") or {}).get(dev) or {}).get("addresses", [])
                 if a["family"] == family]
    for target in [towards] + ([ipaddress.ip_address(gateway)] if gateway else []):
        for a in addresses:
            if target in ipaddress.ip_interface(f"{a['address']}/{a['prefixlen']}").network:
                return a["address"]
    usable = [a for a in addresses if not ipaddress.ip_address(a["address"]).is_link_local]
    return usable[0]["address"] if usable else None


class HostFabricFact(FactBase):
    """The host's network and RDMA view (see the module's doc); one command, nothing changed."""

    def command(self) -> str:
        return fabric_command()

    def process(self, output):
        return parse_fabric(output)
