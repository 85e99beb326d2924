"""A pool member's RDMA rail: of its HCA ports, the active, full-membership ones on one route group (the backend
fabric's rails, not the frontend), in one order on every member (NCCL pairs HCAs by position), with what was
left out and why; and the checks that hold the members' rails to one another. modelfleet.host.fabric builds each
member's container fabric on them."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from modelfleet.host.facts.fabric import natural_key

ROCE_V2 = "RoCE v2"


FULL_PKEY = 0xFFFF


@dataclass
class Rail:
    """One member's HCAs on the chosen route group, and what was left out (with why)."""

    key: str = ""
    link_layer: str = ""
    hcas: list[tuple[str, str]] = field(default_factory=list)  # (hca, port)
    left_out: dict[str, str] = field(default_factory=dict)  # "hca:port" -> why
    family: dict[str, set] = field(default_factory=dict)  # "hca:port" -> {"AF_INET", "AF_INET6"} with RoCE v2


def gid_families(port: dict) -> set[str]:
    """Address families of the port's RoCE v2 GIDs (IPv4-mapped -> AF_INET; global IPv6 -> AF_INET6)."""
    out = set()
    for gid in (port.get("gids") or {}).values():
        if gid.get("type") != ROCE_V2:
            continue
        ip = ipaddress.IPv6Address(gid["gid"])
        if ip.ipv4_mapped:
            out.add("AF_INET")
        elif not ip.is_link_local:
            out.add("AF_INET6")
    return out


def _netdev(hca: dict, port: dict) -> str | None:
    """The port's netdev: its RoCE GIDs' (the kernel's gid_attrs/ndevs), else the HCA's PCI function's."""
    for gid in (port.get("gids") or {}).values():
        if gid.get("ndev"):
            return gid["ndev"]
    return (hca.get("netdevs") or [None])[0]


def _route_key(fact: dict, netdev: str | None, control: str | None) -> str:
    """An HCA's route group. RoCE: `frontend` when its netdev carries the route to the head or a default route;
    else the networks its netdev routes to over gateways (`connected` when none): the rails of one backend
    fabric share them. InfiniBand: its subnet prefix (GID 0)."""
    if netdev is None:
        return "no netdev"
    routes = [r for r in fact.get("routes") or [] if r.get("dev") == netdev]
    if netdev == control or any(r["dst"] in ("0.0.0.0/0", "::/0") for r in routes):
        return "frontend"
    via = sorted({r["dst"] for r in routes if r.get("gateway")})
    return "routes " + ",".join(via) if via else "connected"


def _rail_position(fact: dict, netdev: str | None, name: str) -> tuple:
    """One order on every member: by the netdev's IPv4 subnet (rail N on every host), then the HCA's name."""
    for a in ((fact.get("interfaces") or {}).get(netdev) or {}).get("addresses", []):
        if a["family"] == "inet":
            return (int(ipaddress.ip_interface(f"{a['address']}/{a['prefixlen']}").network.network_address),
                    natural_key(name))
    return (0, natural_key(name))


def rail(fact: dict, control: str | None) -> Rail:
    """This member's active, full-membership HCA ports, grouped by route; the largest group that is not the
    frontend's (the frontend when it is all there is)."""
    groups: dict[str, list] = {}
    left_out: dict[str, str] = {}
    down: dict[str, list] = {}
    families: dict[str, set] = {}
    for name, hca in (fact.get("hcas") or {}).items():
        for num, port in (hca.get("ports") or {}).items():
            ref = f"{name}:{num}"
            layer = port.get("link_layer") or "unknown"
            if layer == "InfiniBand":
                gid0 = ((port.get("gids") or {}).get("0") or {}).get("gid", "")
                key, netdev = "ib subnet " + ":".join(gid0.split(":")[:4]), None
            else:
                netdev = _netdev(hca, port)
                key = _route_key(fact, netdev, control)
            pkey = port.get("pkey") or ""
            if port.get("state") != "ACTIVE":
                why = f"port {num} is {port.get('state') or 'in no state'} (physical state {port.get('phys_state')})"
                down.setdefault(key, []).append((ref, why))
                continue
            if not pkey or int(pkey, 16) != FULL_PKEY:
                left_out[ref] = f"partition key {pkey or 'absent'} is not the full-membership default 0xffff"
                continue
            families[ref] = gid_families(port) if layer == "Ethernet" else set()
            groups.setdefault((layer, key), []).append((_rail_position(fact, netdev, name), name, num))
    if not groups:
        return Rail(left_out={**left_out, **{ref: why for items in down.values() for ref, why in items}})
    backend = [g for g in groups if g[1] != "frontend"] or list(groups)
    chosen = max(backend, key=lambda g: (len(groups[g]), g))
    for group, items in groups.items():
        if group != chosen:
            for _, name, num in items:
                left_out[f"{name}:{num}"] = f"another route group ({group[1]}, {group[0]})"
    for key, items in down.items():
        for ref, why in items:
            left_out[ref] = why + ("" if key == chosen[1] else f"; route group {key}")
    hcas = [(name, num) for _, name, num in sorted(groups[chosen])]
    return Rail(key=chosen[1], link_layer=chosen[0], hcas=hcas, left_out=left_out,
                 family={f"{n}:{p}": families[f"{n}:{p}"] for n, p in hcas})


def check_rails(members, rails: dict[str, Rail], given: dict, errors: list) -> None:
    """Every member on the same rail: one link layer, one route group, as many HCAs as the most any member has
    (NCCL pairs HCAs by position); each RoCE HCA with a RoCE v2 GID."""
    derived = {n: r for n, r in rails.items() if not given.get(n)}
    used = {n: r for n, r in derived.items() if r.hcas}
    if not used:
        return
    most = max(len(r.hcas) for r in used.values())
    top = next(n for n, r in used.items() if len(r.hcas) == most)
    ref = used[top]
    for name, rail in derived.items():
        where = f"host {name}"
        if not rail.hcas:
            errors.append((where, "NCCL_IB_HCA", f"no usable HCA, {top} has {most} ({what_was_left(rail)})"))
            continue
        if rail.link_layer != ref.link_layer:
            errors.append((where, "NCCL_IB_HCA", f"HCAs on {rail.link_layer}, {top}'s on {ref.link_layer}"))
        elif rail.key != ref.key:
            errors.append((where, "NCCL_IB_HCA", f"HCAs on route group {rail.key}, {top}'s on {ref.key}"))
        if len(rail.hcas) < most:
            missing = sorted({h for h, _ in ref.hcas} - {h for h, _ in rail.hcas}, key=natural_key)
            errors.append((where, "NCCL_IB_HCA", f"{len(rail.hcas)} usable HCAs "
                                                 f"({', '.join(h for h, _ in rail.hcas)}), {top} has {most}"
                                                 + (f" (not usable here: {', '.join(missing)})" if missing else "")
                                                 + f": {what_was_left(rail, rail_only=True)}"))
        if rail.link_layer == "Ethernet":
            for hca, port in rail.hcas:
                if not rail.family[f"{hca}:{port}"]:
                    errors.append((where, "NCCL_IB_HCA", f"{hca} port {port} has no RoCE v2 GID (NCCL needs one "
                                                         "on every HCA of the rail)"))


def what_was_left(rail: Rail, rail_only: bool = False) -> str:
    """What was left out and why; `rail_only`: only what would have been on the rail (down, partition key)."""
    items = [(ref, why) for ref, why in rail.left_out.items()
             if not (rail_only and (why.startswith("another route group") or "; route group" in why))]
    return "; ".join(f"{ref}: {why}" for ref, why in items) or "no other HCA on this rail"


def common_family(rails: dict[str, Rail]) -> str | None:
    """The RoCE GIDs' address family every member's rail has: IPv4 where all have it, else IPv6."""
    sets = [f for r in rails.values() if r.link_layer == "Ethernet" for f in r.family.values() if f]
    if not sets:
        return None
    return "AF_INET" if all("AF_INET" in f for f in sets) else "AF_INET6" if all("AF_INET6" in f for f in sets) \
        else "AF_INET"
