"""What NCCL really used, read from its INFO log (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET): the network
(`Using network IB` / `Socket` / a plugin's name), the HCAs behind `NET/IB : Using [0]mlx5_0:1/RoCE ...`, the
interfaces behind `NET/Socket : Using [0]eth0:10.0.0.1<0>`, the transports of the channels (`via NET/IB/0`,
`via P2P/...`), NVLS multicast and the MNNVL fabric each GPU reported. The gate refuses a pool that meant to
use HCAs but ran over sockets: NCCL falls back without a warning."""

from __future__ import annotations

import re

_PREFIX = re.compile(r"NCCL INFO ")
_NET_IB = re.compile(r"^NET/IB ?: Using (.*?)(?:; OOB (\S+))?\s*$")
_IB_DEVICE = re.compile(r"\[\d+\]([^\s:\[]+):(\d+)/(IB|RoCE)(?:/(\S+))?")
_NET_SOCKET = re.compile(r"^NET/Socket ?: Using (.*)$")
_SOCKET_IF = re.compile(r"\[\d+\]([^\s:\[]+):(\S+?)<\d+>")
_NETWORK = re.compile(r"^Using network (.+?)\s*$")
_VIA = re.compile(r"\bvia ((?:NET|P2P|SHM|CollNet|NVLS)[/\w.]*)")
_NVLS = re.compile(r"^NVLS multicast support is (not )?available on dev (\d+)")
_MNNVL = re.compile(r"^MNNVL busId (\S+) fabric UUID (\S+) cliqueId (\S+) state (\d+)")
_VERSION = re.compile(r"\bNCCL version (\S+)")
_NNODES = re.compile(r"\bnRanks (\d+) nNodes (\d+)")


def message(line: str) -> str:
    """The message part of a log line: after `NCCL INFO `, or the whole line where the prefix was stripped."""
    found = _PREFIX.search(line)
    return (line[found.end():] if found else line).strip()


def network_kind(name: str | None) -> str | None:
    """IB (verbs: InfiniBand and RoCE, NCCL's own or the IBext plugin), Socket, or the plugin's own name."""
    if not name:
        return None
    if name.startswith("IB"):
        return "IB"
    return "Socket" if name.startswith("Socket") else name


def parse(lines) -> dict:
    """
    {"network": the last `Using network` name, "kind": IB|Socket|plugin|None, "ib": [{"hca", "port", "link",
    "extra"}] in NCCL's order, "oob": the bootstrap interface, "sockets": [{"ifname", "address"}],
    "ib_none": NCCL found no IB device, "via": sorted channel transports, "nvls": {dev: available},
    "mnnvl": [{"bus", "uuid", "clique", "state"}], "version", "nnodes"}. Every rank of a host prints the same
    device lists: the first one counts (a line cut short later changes nothing).
    """
    out = {"network": None, "kind": None, "ib": [], "oob": None, "sockets": [], "ib_none": False, "via": set(),
           "nvls": {}, "mnnvl": [], "version": None, "nnodes": None}
    for line in lines:
        text = message(line)
        if (found := _NET_IB.match(text)) and not out["ib"]:
            out["ib"] = [{"hca": hca, "port": int(port), "link": link, "extra": extra or None}
                         for hca, port, link, extra in _IB_DEVICE.findall(found.group(1))]
            out["oob"] = found.group(2)
        elif text.startswith("NET/IB : No device found"):
            out["ib_none"] = True
        elif (found := _NET_SOCKET.match(text)) and not out["sockets"]:
            out["sockets"] = [{"ifname": name, "address": address}
                              for name, address in _SOCKET_IF.findall(found.group(1))]
        elif found := _NETWORK.match(text):
            out["network"] = found.group(1)
        elif found := _NVLS.match(text):
            out["nvls"][int(found.group(2))] = found.group(1) is None
        elif found := _MNNVL.match(text):
            out["mnnvl"].append({"bus": found.group(1), "uuid": found.group(2), "clique": found.group(3),
                                 "state": int(found.group(4))})
        if found := _VERSION.search(text):
            out["version"] = found.group(1)
        if found := _NNODES.search(text):
            out["nnodes"] = int(found.group(2))
        out["via"].update(_VIA.findall(text))
    out["kind"] = network_kind(out["network"])
    out["via"] = sorted(out["via"])
    return out


def hcas_used(transport: dict) -> list[str]:
    return [device["hca"] for device in transport["ib"]]


def over_sockets(transport: dict) -> bool:
    """Did the network traffic go over TCP sockets (the network NCCL chose, or the channels' transport)?"""
    return transport["kind"] == "Socket" or any(v.startswith("NET/Socket") for v in transport["via"])
