"""The public tools that print a host's RDMA view (`ibstat`, `ibv_devinfo`, `show_gids`, `rdma link`,
`nvidia-smi topo -m`'s matrix and NIC legend), parsed: the tests' oracle for the fabric fact (facts/fabric.py),
which reads the same HCAs' state from sysfs in one command. Not shipped: no host runs these tools for modelfleet."""

from __future__ import annotations

import re
from collections.abc import Iterable

from modelfleet.host.facts.gpu import NvidiaTopology


def parse_ibstat(lines: Iterable[str]) -> dict[str, dict]:
    """`ibstat`: CA -> {type, firmware, ports: {n: {state, phys_state, rate, link_layer, lid}}}."""
    out: dict[str, dict] = {}
    ca = port = None
    keys = {"State": "state", "Physical state": "phys_state", "Rate": "rate", "Link layer": "link_layer",
            "Base lid": "lid"}
    for line in lines:
        text = line.strip()
        if m := re.match(r"CA '([^']+)'", text):
            ca, port = out.setdefault(m.group(1), {"ports": {}}), None
        elif ca is not None and (m := re.match(r"Port (\d+):$", text)):
            port = ca["ports"].setdefault(m.group(1), {})
        elif ca is not None and ":" in text:
            key, _, value = text.partition(":")
            if port is not None and key in keys:
                port[keys[key]] = value.strip()
            elif key == "CA type":
                ca["type"] = value.strip()
            elif key == "Firmware version":
                ca["firmware"] = value.strip()
    return out


def parse_ibv_devinfo(lines: Iterable[str]) -> dict[str, dict]:
    """`ibv_devinfo [-v]`: hca_id -> {ports: {n: {state, phys_state, link_layer, gids: {i: gid}}}}; states as
    the kernel names them (PORT_ACTIVE -> ACTIVE, LINK_UP -> LinkUp)."""
    out: dict[str, dict] = {}
    hca = port = None
    phys = {"LINK_UP": "LinkUp", "DISABLED": "Disabled", "POLLING": "Polling", "SLEEP": "Sleep"}
    for line in lines:
        text = line.strip()
        if m := re.match(r"hca_id:\s*(\S+)", text):
            hca, port = out.setdefault(m.group(1), {"ports": {}}), None
        elif hca is not None and (m := re.match(r"port:\s*(\d+)", text)):
            port = hca["ports"].setdefault(m.group(1), {"gids": {}})
        elif port is not None and (m := re.match(r"\**GID\[\s*(\d+)\]:\s*(\S+)", text)):
            port["gids"][m.group(1)] = {"gid": m.group(2)}
        elif port is not None and ":" in text:
            key, _, value = text.partition(":")
            value = re.sub(r"\s*\(\d+\)$", "", value.strip())
            if key == "state":
                port["state"] = value.removeprefix("PORT_")
            elif key == "phys_state":
                port["phys_state"] = phys.get(value, value)
            elif key == "link_layer":
                port["link_layer"] = value
    return out


def parse_show_gids(lines: Iterable[str]) -> list[dict]:
    """`show_gids` (mlnx-tools): one row per GID: dev, port, index, gid, ipv4, version (v1/v2), netdev."""
    out = []
    for line in lines:
        cells = line.split()
        if len(cells) >= 6 and cells[1].isdigit() and cells[2].isdigit():
            ipv4 = cells[4] if len(cells) == 7 else ""
            out.append({"dev": cells[0], "port": cells[1], "index": cells[2], "gid": cells[3], "ipv4": ipv4,
                        "version": cells[-2], "netdev": cells[-1]})
    return out


def parse_rdma_link(lines: Iterable[str]) -> dict[str, dict]:
    """`rdma link show`: 'dev/port' -> {state, phys_state, netdev}."""
    out = {}
    for line in lines:
        cells = line.split()
        if len(cells) >= 2 and cells[0] == "link":
            words = dict(zip(cells[2::2], cells[3::2], strict=False))
            out[cells[1]] = {"state": words.get("state"), "phys_state": words.get("physical_state"),
                             "netdev": words.get("netdev")}
    return out


def parse_nic_legend(lines: Iterable[str]) -> dict[str, str]:
    """`nvidia-smi topo -m`'s NIC Legend: NIC0 -> mlx5_0 (the matrix itself: facts.gpu.NvidiaTopology)."""
    out = {}
    legend = False
    for line in lines:
        if line.strip() == "NIC Legend:":
            legend = True
        elif legend and (m := re.match(r"\s*(NIC\d+):\s*(\S+)", line)):
            out[m.group(1)] = m.group(2)
    return out


def topology_distances(lines: list[str]) -> dict[str, dict[str, str]]:
    """GPU index -> HCA name -> topo's word, from `nvidia-smi topo -m` (matrix and NIC legend together)."""
    topo = NvidiaTopology().process(lines) or {}
    legend = parse_nic_legend(lines)
    return {gpu.removeprefix("GPU"): {legend[nic]: topo["matrix"][gpu][nic] for nic in topo.get("nics", [])
                                      if nic in legend} for gpu in topo.get("gpus", [])}
