"""A multi-node pool's fabric: what each member's container needs to reach the others over the right interface,
the right RDMA devices and (on NVLink-domain boards) IMEX, derived from the members' fabric facts, with the reason
for every value. The gate's container and the engine's get the same HostFabric."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from modelfleet.host.facts.fabric import route_to
from modelfleet.host.rails import Rail, check_rails, common_family, rail, what_was_left
from modelfleet.plan.catalog import load_catalog
from modelfleet.plan.inventory.plan import HostFabric


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
        errors.append((where, "NCCL_SOCKET_IFNAME",
                       f"no interface reaches head {head}: no route covers it and "
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
    rails: dict[str, Rail] = {}
    for plan, fact in members:
        control = _control(plan, fact, head, out.errors)
        if control:
            controls[plan.name] = control
        rails[plan.name] = rail(fact, control[0] if control else None)
    given_hca = {p.name: p.network_env.get("NCCL_IB_HCA") for p, _ in members}
    check_rails(members, rails, given_hca, out.errors)
    family = common_family(rails)
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


def host_ip_envs() -> list[tuple[str, str]]:
    """(variable, engine) for every engine that reads its node's address from the environment (the catalog's
    `host_ip_env`): a pool's members get each, whatever engine the pool runs."""
    return [(e.host_ip_env, name) for name, e in load_catalog().engines.items() if e.host_ip_env]


def _host(plan, fact, head, control, rail: Rail, family, given_hca, imex, imex_nodes, errors,
          head_text: str) -> HostFabric:
    ifname, _ = control
    reasons: dict[str, str] = {}
    env = _sockets(plan, head, control, head_text, reasons, errors)
    hcas = _hcas(plan, fact, rail, given_hca, ifname, env, reasons, errors)
    devices = _rdma(plan, fact, rail, family, hcas, env, reasons, errors) if hcas else []
    if not hcas:
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
        reasons["devices"] = (reasons.get("devices", "") + "; " if hcas else "") + "the IMEX channel"
    distances = {gpu: {h: word for h, word in row.items() if h in hcas}
                 for gpu, row in (fact.get("distances") or {}).items()} if hcas else {}
    return HostFabric(host=plan.name, ifname=ifname, head_address=head, hcas=hcas, env=env, devices=tuple(devices),
                      rdma=bool(hcas), imex=imex, imex_nodes=imex_nodes if imex else (), reasons=reasons,
                      distances=distances)


def _sockets(plan, head: str, control: tuple[str, dict], head_text: str, reasons: dict,
             errors: list) -> dict[str, str]:
    """The control interface NCCL and Gloo open their sockets on (the inventory's, checked, else the one that
    routes to the head), and each engine's own address on it."""
    ifname, route = control
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
    return env


def _hcas(plan, fact, rail: Rail, given_hca: str | None, ifname: str, env: dict, reasons: dict,
          errors: list) -> tuple[str, ...]:
    """The HCAs NCCL uses: the inventory's NCCL_IB_HCA (checked against the host, unless an exclusion list),
    else the member's rail; none: sockets."""
    hca_info = fact.get("hcas") or {}
    if not given_hca:
        if not rail.hcas:
            reasons["NCCL_IB_HCA"] = f"no usable HCA ({what_was_left(rail)}): NCCL uses sockets over {ifname}"
            return ()
        hcas = tuple(h for h, _ in rail.hcas)
        env["NCCL_IB_HCA"] = "=" + ",".join(f"{h}:{p}" for h, p in rail.hcas)
        left = f"; left out: {what_was_left(rail)}" if rail.left_out else ""
        reasons["NCCL_IB_HCA"] = (f"{len(hcas)} active full-membership {rail.link_layer} HCA ports on route group "
                                  f"{rail.key}, in rail order{left}")
        return hcas
    env["NCCL_IB_HCA"] = given_hca
    if given_hca.startswith("^"):
        reasons["NCCL_IB_HCA"] = "from the inventory (an exclusion list: not checked against the host)"
        return tuple(h for h, _ in rail.hcas if not any(h.startswith(x) for x in _names(given_hca[1:])))
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
    return hcas


def _rdma(plan, fact, rail: Rail, family: str | None, hcas: tuple[str, ...], env: dict, reasons: dict,
          errors: list) -> list[str]:
    """What using `hcas` takes: RoCE's address family, the RDMA device nodes (each checked present), IPC_LOCK
    and memlock, and whether GPUDirect RDMA has its module. Returns the device nodes."""
    hca_info = fact.get("hcas") or {}
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
    reasons["devices"] = f"rdma_cm and the uverbs nodes of {', '.join(hcas)}"
    reasons["rdma"] = "HCAs are used: the container needs IPC_LOCK and an unlimited memlock"
    peermem = (fact.get("modules") or {}).get("nvidia_peermem")
    reasons["gpudirect"] = ("nvidia_peermem is loaded" if peermem else
                            "nvidia_peermem is not loaded: GPUDirect RDMA needs DMA-BUF (open kernel module, "
                            "kernel >= 5.12) or that module")
    return [f"/dev/infiniband/{name}" for name in wanted]


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
