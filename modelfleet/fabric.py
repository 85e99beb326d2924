"""A multi-node pool's fabric: what each member's container needs to reach the others over the right interface,
the right RDMA devices and (on NVLink-domain boards) IMEX, derived from the members' fabric facts, with the reason
for every value. The gate's container and the engine's get the same HostFabric."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from modelfleet.catalog import load_catalog
from modelfleet.facts.fabric import natural_key, route_to


@dataclass(frozen=True)
class HostFabric:
    """One pool member's fabric, as its containers get it."""

    host: str
    ifname: str | None  # the control interface: the one that routes to the pool's head
    head_address: str  # the head's address on that interface (never the SSH address when a fabric one exists)
    hcas: tuple[str, ...] = ()  # active HCAs used by NCCL, in the same order on every member
    env: dict[str, str] = field(default_factory=dict)  # NCCL_/GLOO_/engine host-IP variables, exact-match forms
    devices: tuple[str, ...] = ()  # host device nodes passed into the container (RDMA, IMEX channel)
    rdma: bool = False  # HCAs are used: the container needs IPC_LOCK and an unlimited memlock
    imex: bool = False  # NVLink domain: IMEX node list, service and channel on this host
    imex_nodes: tuple[str, ...] = ()  # the domain's fabric addresses, in pool order (IMEX's node list)
    reasons: dict[str, str] = field(default_factory=dict)  # value name -> why it has this value
    distances: dict[str, dict[str, str]] = field(default_factory=dict)  # GPU PCI address -> HCA -> PIX/PXB/...


@dataclass
class PoolFabric:
    """Every member's HostFabric, or the problems that stop the pool before anything starts."""

    pool: str
    hosts: dict[str, HostFabric] = field(default_factory=dict)
    errors: list[tuple[str, str, str]] = field(default_factory=list)  # (host X | pool P, field, message)
    # Why nothing was derived although nothing is wrong (a member's probe has no fabric part): same shape.
    notes: list[tuple[str, str, str]] = field(default_factory=list)


RDMA_CM = "/dev/infiniband/rdma_cm"
IMEX_CHANNEL = "/dev/nvidia-caps-imex-channels/channel0"
# NCCL over a multi-node NVLink domain (the Kimi K3 recipes' GB300 NVL environment): MNNVL needs cuMem buffers.
MNNVL_ENV = {"NCCL_MNNVL_ENABLE": "1", "NCCL_CUMEM_ENABLE": "1"}
ROCE_V2 = "RoCE v2"
FULL_PKEY = 0xFFFF


def head_of(first) -> tuple[str, bool]:
    """The pool's head address (its first host's fabric_address), and whether that is its SSH address (the
    inventory set no fabric_address)."""
    head = first.fabric_address or first.address
    return head, head == first.address


def head_reason(first, head: str, on_ssh: bool, over: str | None = None) -> str:
    """Where the head address comes from, and the interface that reaches it once the facts are read."""
    reached = f", reached over {over}" if over else ""
    if on_ssh:
        return (f"{head}: {first.name}'s SSH address (the inventory sets no fabric_address){reached}: set "
                "fabric_address to the head's address on the pool network where it has one")
    return f"{head}: {first.name}'s fabric_address (from the inventory){reached}"
INVENTORY_KEYS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA")


def nvlink_domain(hardware) -> bool:
    """Boards whose NVLink domain spans trays (GB200/GB300 NVL72, NVL36): IMEX and MNNVL. Read from the catalog's
    `interconnect` (`nvlink5-nvl72`) until the hardware catalog says it in a field of its own."""
    return bool(re.search(r"-nvl\d+$", hardware.interconnect or ""))


@dataclass
class _Rail:
    """One member's HCAs on the chosen route group, and what was left out (with why)."""

    key: str = ""
    link_layer: str = ""
    hcas: list[tuple[str, str]] = field(default_factory=list)  # (hca, port)
    left_out: dict[str, str] = field(default_factory=dict)  # "hca:port" -> why
    family: dict[str, set] = field(default_factory=dict)  # "hca:port" -> {"AF_INET", "AF_INET6"} with RoCE v2


def _gid_families(port: dict) -> set[str]:
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


def _rail(fact: dict, control: str | None) -> _Rail:
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
            families[ref] = _gid_families(port) if layer == "Ethernet" else set()
            groups.setdefault((layer, key), []).append((_rail_position(fact, netdev, name), name, num))
    if not groups:
        return _Rail(left_out={**left_out, **{ref: why for items in down.values() for ref, why in items}})
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
    return _Rail(key=chosen[1], link_layer=chosen[0], hcas=hcas, left_out=left_out,
                 family={f"{n}:{p}": families[f"{n}:{p}"] for n, p in hcas})


def _names(value: str) -> list[str]:
    return [n for n in value.lstrip("=").split(",") if n]


def _control(plan, fact: dict, head: str, errors: list) -> tuple[str, dict] | None:
    """The interface that routes to the head (or the inventory's, checked), and the route."""
    where = f"host {plan.name}"
    route = route_to(fact, head)
    interfaces = fact.get("interfaces") or {}
    refused = False
    for key in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        given = plan.network_env.get(key)
        if given and not given.startswith("^") and not _given_reaches(key, given, route, interfaces, head, where,
                                                                      errors):
            refused = True
    if refused:
        return None
    if route is None:
        devs = sorted({str(r["dev"]) for r in fact.get("routes") or []})
        errors.append((where, "NCCL_SOCKET_IFNAME", f"no interface reaches head {head}: no route covers it and "
                                                    f"there is no default route (routes on {', '.join(devs) or 'none'})"))
        return None
    state = (interfaces.get(route["dev"]) or {}).get("state")
    if state == "down":
        errors.append((where, "NCCL_SOCKET_IFNAME", f"interface {route['dev']} routes to head {head} but is down"))
        return None
    return route["dev"], route


def _given_reaches(key: str, given: str, route: dict | None, interfaces: dict, head: str, where: str,
                   errors: list) -> bool:
    """Does the inventory's interface list exist on the host and hold the interface that routes to the head?
    (NCCL reads `=name` as exact and a bare name as a prefix; Gloo takes one exact name.)"""
    exact = given.startswith("=") or key == "GLOO_SOCKET_IFNAME"
    for name in _names(given):
        if not any(n == name or (not exact and n.startswith(name)) for n in interfaces):
            errors.append((where, key, f"interface {name} does not exist on this host (it has "
                                       f"{', '.join(sorted(interfaces)) or 'none'})"))
            return False
    dev = route["dev"] if route else None
    if not any(dev == n or (not exact and dev and dev.startswith(n)) for n in _names(given)):
        via = f"its route is {route['dst']} dev {dev}" if route else "the host has no route to it"
        errors.append((where, key, f"interface {given.lstrip('=')} does not reach head {head} ({via})"))
        return False
    return True


def _route_text(route: dict) -> str:
    via = f" via {route['gateway']}" if route.get("gateway") else ""
    return f"{route['dst']}{via} dev {route['dev']}"


def derive(pool_name: str, members: list[tuple]) -> PoolFabric:
    """The pool's fabric from its members' fabric facts, head first: each member's control interface, host IP,
    HCAs, devices and environment with the reason for each, or the errors that stop the pool."""
    out = PoolFabric(pool=pool_name)
    if not members:
        return out
    head_plan = members[0][0]
    head, head_ssh = head_of(head_plan)
    try:
        ipaddress.ip_address(head)
    except ValueError:
        out.errors.append((f"host {head_plan.name}", "fabric_address", f"{head} is not an IP address: the pool's "
                           "members route to the head's address on the fabric; set fabric_address"))
        return out
    missing = [p.name for p, fact in members if not fact]
    if missing:
        out.notes += [(f"host {name}", "fabric", "not derived: the host's probe has no fabric part (its network "
                                                  "and RDMA view was not read)") for name in missing]
        return out
    imex = nvlink_domain(head_plan.hardware)
    imex_nodes = tuple(p.fabric_address or p.address for p, _ in members)
    controls: dict[str, tuple[str, dict]] = {}
    rails: dict[str, _Rail] = {}
    for plan, fact in members:
        control = _control(plan, fact, head, out.errors)
        if control:
            controls[plan.name] = control
        rails[plan.name] = _rail(fact, control[0] if control else None)
    given_hca = {p.name: p.network_env.get("NCCL_IB_HCA") for p, _ in members}
    _check_rails(members, rails, given_hca, out.errors)
    family = _family(rails)
    for plan, fact in members:
        if plan.name not in controls or plan.name not in rails:
            continue
        out.hosts[plan.name] = _host(plan, fact, head, controls[plan.name], rails[plan.name], family,
                                     given_hca[plan.name], imex, imex_nodes, out.errors,
                                     head_reason(head_plan, head, head_ssh, controls[plan.name][0]))
    counts = {name: len(h.hcas) for name, h in out.hosts.items()}
    if len(set(counts.values())) > 1 and any(given_hca.values()):
        out.errors.append((f"pool {pool_name}", "NCCL_IB_HCA", "members use different numbers of HCAs (NCCL pairs "
                           f"them by position): {', '.join(f'{n} {c}' for n, c in counts.items())}"))
    if out.errors:
        out.hosts = {}
    return out


def _check_rails(members, rails: dict[str, _Rail], given: dict, errors: list) -> None:
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
            errors.append((where, "NCCL_IB_HCA", f"no usable HCA, {top} has {most} ({_left(rail)})"))
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
                                                 + f": {_left(rail, rail_only=True)}"))
        if rail.link_layer == "Ethernet":
            for hca, port in rail.hcas:
                if not rail.family[f"{hca}:{port}"]:
                    errors.append((where, "NCCL_IB_HCA", f"{hca} port {port} has no RoCE v2 GID (NCCL needs one "
                                                         "on every HCA of the rail)"))


def _left(rail: _Rail, rail_only: bool = False) -> str:
    """What was left out and why; `rail_only`: only what would have been on the rail (down, partition key)."""
    items = [(ref, why) for ref, why in rail.left_out.items()
             if not (rail_only and (why.startswith("another route group") or "; route group" in why))]
    return "; ".join(f"{ref}: {why}" for ref, why in items) or "no other HCA on this rail"


def _family(rails: dict[str, _Rail]) -> str | None:
    """The RoCE GIDs' address family every member's rail has: IPv4 where all have it, else IPv6."""
    sets = [f for r in rails.values() if r.link_layer == "Ethernet" for f in r.family.values() if f]
    if not sets:
        return None
    return "AF_INET" if all("AF_INET" in f for f in sets) else "AF_INET6" if all("AF_INET6" in f for f in sets) \
        else "AF_INET"


def host_ip_envs() -> list[tuple[str, str]]:
    """(variable, engine) for every engine that reads its node's address from the environment (the catalog's
    `host_ip_env`): a pool's members get each, whatever engine the pool runs."""
    return [(e.host_ip_env, name) for name, e in load_catalog().engines.items() if e.host_ip_env]


def _host(plan, fact, head, control, rail: _Rail, family, given_hca, imex, imex_nodes, errors,
          head_text: str) -> HostFabric:
    ifname, route = control
    reasons: dict[str, str] = {}
    env: dict[str, str] = {}
    net = plan.network_env
    text = (f"{ifname} holds the head's address {head} (this host is the head)" if route.get("src") == head else
            f"{ifname} routes to head {head} ({_route_text(route)})")
    reasons["ifname"] = text
    reasons["head_address"] = head_text
    for key, value in (("NCCL_SOCKET_IFNAME", f"={ifname}"), ("GLOO_SOCKET_IFNAME", ifname)):
        if net.get(key):
            env[key], reasons[key] = net[key], f"from the inventory; checked: {text}"
        else:
            env[key], reasons[key] = value, text
    src = route.get("src")
    if src:
        for key, engine in host_ip_envs():
            env[key] = src
            reasons[key] = f"{engine}'s own address: {ifname}'s source address towards head {head}"
    else:
        errors.append((f"host {plan.name}", "host address", f"interface {ifname} has no address towards head {head}"))
    hcas: tuple[str, ...] = ()
    devices: list[str] = []
    hca_info = fact.get("hcas") or {}
    if given_hca:
        env["NCCL_IB_HCA"] = given_hca
        if given_hca.startswith("^"):
            reasons["NCCL_IB_HCA"] = "from the inventory (an exclusion list: not checked against the host)"
            hcas = tuple(h for h, _ in rail.hcas if not any(h.startswith(x) for x in _names(given_hca[1:])))
        else:
            picked = []
            for item in _names(given_hca):
                name, _, port = item.partition(":")
                matches = [h for h in hca_info if h == name or (not given_hca.startswith("=") and h.startswith(name))]
                if not matches:
                    errors.append((f"host {plan.name}", "NCCL_IB_HCA", f"HCA {name} does not exist on this host "
                                                                       f"(it has {', '.join(hca_info) or 'none'})"))
                for h in matches:
                    for num, p in (hca_info[h].get("ports") or {}).items():
                        if port and num != port:
                            continue
                        if p.get("state") != "ACTIVE":
                            errors.append((f"host {plan.name}", "NCCL_IB_HCA", f"{h} port {num} is {p.get('state')}"))
                        picked.append(h)
            hcas = tuple(dict.fromkeys(picked))
            reasons["NCCL_IB_HCA"] = f"from the inventory; checked: {', '.join(hcas) or 'none'} exist and are active"
    elif rail.hcas:
        hcas = tuple(h for h, _ in rail.hcas)
        env["NCCL_IB_HCA"] = "=" + ",".join(f"{h}:{p}" for h, p in rail.hcas)
        left = f"; left out: {_left(rail)}" if rail.left_out else ""
        reasons["NCCL_IB_HCA"] = (f"{len(hcas)} active full-membership {rail.link_layer} HCA ports on route group "
                                  f"{rail.key}, in rail order{left}")
    else:
        reasons["NCCL_IB_HCA"] = f"no usable HCA ({_left(rail)}): NCCL uses sockets over {ifname}"
    rdma = bool(hcas)
    if rdma:
        if rail.link_layer == "Ethernet" and family:
            env["NCCL_IB_ADDR_FAMILY"] = family
            env["NCCL_IB_ROCE_VERSION_NUM"] = "2"
            reasons["NCCL_IB_ADDR_FAMILY"] = (f"every rail HCA of the pool has a RoCE v2 GID of {family}; NCCL picks "
                                              "the GID index itself (differs between hosts, so none is pinned)")
            reasons["NCCL_IB_ROCE_VERSION_NUM"] = "RoCE v2 (routable) GIDs only"
        present = set(fact.get("dev_infiniband") or [])
        wanted = [RDMA_CM.rsplit("/", 1)[1]] + [hca_info[h]["uverbs"] for h in hcas if hca_info.get(h, {}).get("uverbs")]
        missing = [h for h in hcas if not hca_info.get(h, {}).get("uverbs")]
        for name in wanted:
            if name not in present:
                errors.append((f"host {plan.name}", "devices", f"/dev/infiniband/{name} is absent (ib_uverbs / "
                                                               "rdma_ucm not loaded?)"))
        for h in missing:
            errors.append((f"host {plan.name}", "devices", f"{h} has no uverbs device (ib_uverbs not loaded?)"))
        devices += [f"/dev/infiniband/{name}" for name in wanted]
        reasons["devices"] = f"rdma_cm and the uverbs nodes of {', '.join(hcas)}"
        reasons["rdma"] = "HCAs are used: the container needs IPC_LOCK and an unlimited memlock"
        peermem = (fact.get("modules") or {}).get("nvidia_peermem")
        reasons["gpudirect"] = ("nvidia_peermem is loaded" if peermem else
                                "nvidia_peermem is not loaded: GPUDirect RDMA needs DMA-BUF (open kernel module, "
                                "kernel >= 5.12) or that module")
    else:
        reasons["rdma"] = "no HCA is used"
    if imex:
        devices.append(IMEX_CHANNEL)
        env.update(MNNVL_ENV)
        state = fact.get("imex") or {}
        channels = ", ".join(state.get("channels") or []) or "none"
        reasons["imex"] = (f"{plan.hardware.id}'s NVLink domain spans trays ({plan.hardware.interconnect}): IMEX "
                           f"over {', '.join(imex_nodes)}; now: channels {channels}, "
                           f"service {state.get('active') or 'absent'}")
        reasons["imex_nodes"] = "the members' fabric addresses, in pool order"
        reasons["NCCL_MNNVL_ENABLE"] = "NCCL over the multi-node NVLink domain (the IMEX channel)"
        reasons["NCCL_CUMEM_ENABLE"] = "MNNVL shares cuMem buffers across the domain"
        reasons["devices"] = (reasons.get("devices", "") + "; " if rdma else "") + "the IMEX channel"
    distances = {gpu: {h: word for h, word in row.items() if h in hcas}
                 for gpu, row in (fact.get("distances") or {}).items()} if hcas else {}
    return HostFabric(host=plan.name, ifname=ifname, head_address=head, hcas=hcas, env=env, devices=tuple(devices),
                      rdma=rdma, imex=imex, imex_nodes=imex_nodes if imex else (), reasons=reasons,
                      distances=distances)


def expected(pool_name: str, members: Iterable) -> PoolFabric:
    """What the inventory and the catalog fix before any host is probed (`modelfleet render`): the head address,
    the inventory's interface settings, IMEX on NVLink-domain boards; the rest is derived on the hosts."""
    plans = [m[0] if isinstance(m, tuple) else m for m in members]
    out = PoolFabric(pool=pool_name)
    if not plans:
        return out
    first = plans[0]
    head, head_ssh = head_of(first)
    imex = nvlink_domain(first.hardware)
    nodes = tuple(p.fabric_address or p.address for p in plans)
    later = "derived on the hosts at run time"
    for plan in plans:
        env = {k: plan.network_env[k] for k in INVENTORY_KEYS if plan.network_env.get(k)}
        reasons = {k: "from the inventory" for k in env}
        given = plan.network_env.get("NCCL_SOCKET_IFNAME", "")
        ifname = given[1:] if given.startswith("=") and "," not in given else None
        reasons["ifname"] = "from the inventory" if ifname else later
        reasons["head_address"] = head_reason(first, head, head_ssh)
        for key in INVENTORY_KEYS + tuple(key for key, _ in host_ip_envs()):
            reasons.setdefault(key, later)
        reasons["devices"] = later + ("; the IMEX channel" if imex else "")
        devices: tuple[str, ...] = ()
        if imex:
            env.update(MNNVL_ENV)
            devices = (IMEX_CHANNEL,)
            reasons["imex"] = f"{plan.hardware.id}'s NVLink domain spans trays ({plan.hardware.interconnect})"
            reasons["NCCL_MNNVL_ENABLE"] = "NCCL over the multi-node NVLink domain (from the hardware catalog)"
            reasons["NCCL_CUMEM_ENABLE"] = "MNNVL shares cuMem buffers across the domain (from the hardware catalog)"
        out.hosts[plan.name] = HostFabric(host=plan.name, ifname=ifname, head_address=head, env=env, devices=devices,
                                          imex=imex, imex_nodes=nodes if imex else (), reasons=reasons)
    return out


def report(fabric: PoolFabric) -> dict:
    """The pool's fabric as the reports write it: each member's values and reasons, and the errors."""
    return {"pool": fabric.pool, "ok": not fabric.errors,
            "errors": [f"{where}: {fld}: {msg}" for where, fld, msg in fabric.errors],
            "notes": [f"{where}: {fld}: {msg}" for where, fld, msg in fabric.notes],
            "hosts": {name: {"ifname": h.ifname, "head_address": h.head_address, "hcas": list(h.hcas), "env": h.env,
                             "devices": list(h.devices), "rdma": h.rdma, "imex": h.imex,
                             "imex_nodes": list(h.imex_nodes), "reasons": h.reasons, "distances": h.distances}
                      for name, h in fabric.hosts.items()}}
