"""The front doors an inventory asks for (the services' `router*` settings), checked: one per router host and
served name, its router known to the catalog (modelfleet.plan.catalog.routers), its address, ports, TLS files and
clients' keys sound, its replicas bound where only the router reaches them, and prefill/decode layouts whole.
Problems are collected, each naming the host or front door and the field. modelfleet.plan.router renders the files."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import replace

from modelfleet.base import grammar, keys
from modelfleet.plan.catalog.routers import bootstrap_port, pd_role, specs
from modelfleet.plan.exposure import door_needed, routed_replica_problem
from modelfleet.plan.inventory import tls
from modelfleet.plan.inventory.plan import HostPlan, PoolPlan, RouterPlan, Worker, _is_loopback

# What a proxy front door can hold in its config: a bearer token's characters (RFC 6750 b64token).
PROXY_KEY = re.compile(r"^[A-Za-z0-9._~+/=-]{8,512}$")


def _ip(value: str) -> bool:
    return grammar.address(value) is None


def _wildcard(address: str) -> bool:
    return ipaddress.ip_address(address).is_unspecified


def resolve(hosts: dict[str, HostPlan], pools: dict[str, PoolPlan], errors: list, reserved: dict[int, str],
            offline: bool = False, warnings: list | None = None) -> tuple[dict[str, HostPlan], dict[str, RouterPlan]]:
    """
    The front doors the services' `router*` settings ask for (one per router host and served name), and the
    hosts with their routed replicas bound where only the router reaches them: loopback on the router host
    itself, the fabric address elsewhere. Problems go to `errors`, naming the host or front door and field.
    """
    routed: dict[tuple[str, str], list] = {}
    for plan in hosts.values():
        for svc in plan.services:
            if svc.router:
                routed.setdefault((svc.router.host, svc.served_name), []).append(svc)
    errors += pd_pairs(pools)
    lone = {served for (_, served), found in _pd_parts(pools).items() if not all(found.values())}
    routers: dict[str, RouterPlan] = {}
    for (router_host, served), services in routed.items():
        door = _front_door(hosts, router_host, served, services, served in lone, routers, errors, reserved, offline,
                           warnings)
        if door is not None:
            routers[door.name] = door
    out = {}
    for name, plan in hosts.items():
        services = tuple(_bound(hosts, s) if s.router else s for s in plan.services)
        out[name] = replace(plan, services=services,
                            routers=tuple(rp for rp in routers.values() if rp.host == name))
    return out, routers


def door_scopes(hosts: dict[str, HostPlan]) -> dict[str, set[str]]:
    """host -> the front-door scopes that hold there (modelfleet.plan.inventory.applies): a service names it in
    `router`; one of those routers checks no key itself (an engine with no router in the catalog counts, its
    own error said by the front door's check)."""
    out: dict[str, set[str]] = {}
    for plan in hosts.values():
        for svc in plan.services:
            if svc.router:
                scopes = out.setdefault(svc.router.host, {"front_door"})
                rspec = specs().get(svc.engine_name)
                if rspec is None or rspec.auth == "proxy":
                    scopes.add("open_router")
    return out


def _front_door(hosts: dict[str, HostPlan], router_host: str, served: str, services: list, lone: bool,
                routers: dict[str, RouterPlan], errors: list, reserved: dict[int, str],
                offline: bool, warnings: list | None = None) -> RouterPlan | None:
    """The front door of `served` on `router_host` over its replicas `services`; None where it has a problem
    (in `errors`). `lone`: a prefill/decode part whose other part is missing (said once, by pd_pairs)."""
    name = front_door_name(served)
    where = f"router {name}"
    problems = len(errors)
    head = services[0]
    for svc in services:
        if not svc.api_key_env:
            errors.append((f"host {svc.host}", "api_key_env", f"{served} is served through the front door on "
                           f"{router_host}, which refuses requests without the model's key: set api_key_env"))
    if router_host not in hosts:
        errors.append((f"host {head.host}", "router", f"{router_host!r} is not a host of this inventory "
                       f"(hosts: {', '.join(sorted(hosts))})"))
        return None
    if head.engine_name not in specs():
        errors.append((f"host {head.host}", "router", f"{head.engine_name} has no router in the catalog "
                       f"(routers: {', '.join(sorted(specs()))})"))
        return None
    errors += _disagreements(where, served, services)
    rhost = hosts[router_host]
    roles = {s.pool: pd_role(s.recipe, s.engine_name) for s in services}
    errors += _door_problems(where, served, head, rhost, roles, lone, reserved, offline, warnings)
    if name in routers:
        errors.append((where, "router", f"{served} already has a front door on {routers[name].host}"))
    if len(errors) > problems:
        return None
    workers = tuple(Worker(pool=s.pool, host=s.host, url=f"http://{_replica_address(hosts, s, router_host)}:"
                           f"{s.port}", role=roles[s.pool],
                           bootstrap_port=bootstrap_port(s.recipe, s.engine_name) if roles[s.pool] == "prefill"
                           else None) for s in services if s.node_rank == 0)
    door = RouterPlan(name=name, host=router_host, engine_name=head.engine_name, served_name=served,
                      bind_address=head.router.bind_address or rhost.address, port=head.router.port,
                      policy=head.router.policy, api_key_env=head.api_key_env, config_dir=rhost.config_dir,
                      workers=tuple(sorted(workers, key=lambda w: w.url)), pd=any(roles.values()),
                      tls_cert=head.router.tls_cert, tls_key=head.router.tls_key,
                      client_keys_env=head.router.client_keys_env, server_name=head.router.server_name,
                      host_address=rhost.address, worker_firewall=rhost.router_worker_firewall)
    # Refused, though planned (the plan shows what would run): a replica off loopback whose engine leaves a
    # route open and that no keyed proxy can cover (a PD server, whose other part reaches it directly too; an
    # engine whose key coverage modelfleet does not know).
    for svc in services:
        address = _replica_address(hosts, svc, router_host)
        if _is_loopback(address) or (door_needed(svc.engine_name) and not roles[svc.pool]):
            continue
        exposed = routed_replica_problem(svc.engine_name, address, router_host, roles[svc.pool])
        if exposed:
            errors.append((f"host {svc.host}", "router", exposed))
    return door


def _disagreements(where: str, served: str, services: list) -> list[tuple[str, str, str]]:
    """The replicas of one front door name one engine, model, key and router settings."""
    out = []
    for fld, value in (("engine", lambda s: s.engine_name), ("model", lambda s: s.model.id),
                       ("api_key_env", lambda s: s.api_key_env or ""), ("router_port", lambda s: s.router.port),
                       ("router_bind_address", lambda s: s.router.bind_address or ""),
                       ("router_policy", lambda s: s.router.policy),
                       ("router_tls_cert", lambda s: s.router.tls_cert or ""),
                       ("router_server_name", lambda s: s.router.server_name or ""),
                       ("router_client_keys_env", lambda s: ",".join(s.router.client_keys_env)),
                       ("router_tls_key", lambda s: s.router.tls_key or "")):
        values = sorted({str(value(s)) for s in services})
        if len(values) > 1:
            out.append((where, fld, f"the replicas of {served} disagree: {', '.join(values)}"))
    return out


def _door_problems(where: str, served: str, head, rhost: HostPlan, roles: dict[str, str | None], lone: bool,
                   reserved: dict[int, str], offline: bool, warnings: list | None = None) -> list[tuple[str, str, str]]:
    """The front door's own settings (its head replica's): prefill/decode parts whole, the policy its router
    has, an address to listen on, three free ports, a key the proxy can hold, TLS files and clients' keys."""
    errors = []
    router_host, rspec = rhost.name, specs()[head.engine_name]
    if any(roles.values()) and not all(roles.values()):
        plain = sorted(p for p, role in roles.items() if not role)
        errors.append((where, "recipe", f"the front door of {served} pairs prefill and decode pools, but "
                       f"{', '.join(plain)} run a recipe of neither part: serve it under another name"))
    elif any(roles.values()) and set(roles.values()) != {"prefill", "decode"} and not lone:
        errors.append((where, "router", f"the front door of {served} on {router_host} has only "
                       f"{next(iter(set(roles.values())))} pools: its prefill and decode pools name one router"))
    if head.router.policy not in rspec.policies:
        errors.append((where, "router_policy", f"{head.router.policy} is not a policy of {rspec.package} "
                       f"(it has: {', '.join(rspec.policies)})"))
    bind = head.router.bind_address or rhost.address
    if not _ip(bind):
        errors.append((where, "router_bind_address", f"unset, and the router host's address {bind!r} is not "
                       "an IP address to listen on: set router_bind_address"))
    taken = {**reserved, rhost.ssh_port: "SSH"}
    for s in rhost.services:
        taken |= {port: f"pool {s.pool}" + ("" if port == s.port else f" ({s.engine_name} listens there too, at "
                                                                       f"port + {port - s.port})") for port in s.ports}
    for port, what in ((head.router.port, "the front door"), (head.router.port + 1, "the router behind it"),
                       (head.router.port + 2, "the router's metrics")):
        if port > 65535 or port in taken:
            errors.append((where, "router_port", f"{head.router.port}: port {port} ({what}) is "
                           f"{'out of range' if port > 65535 else 'used by ' + taken[port]} on {router_host}"))
    key = keys.from_env(head.api_key_env)
    proxied = rspec.auth == "proxy" or head.router.tls_cert or head.router.client_keys_env
    if proxied and key and not offline and not 8 <= len(key.strip()) <= 512:
        errors.append((where, "api_key_env", f"the value of {head.api_key_env} (not shown) is "
                       f"{len(key.strip())} characters long: the front door takes keys of 8 to 512"))
    elif proxied and key and not offline and not PROXY_KEY.match(key.strip()):
        errors.append((where, "api_key_env", f"the value of {head.api_key_env} (not shown) has characters the "
                       "proxy's config cannot hold: use 8-512 of A-Z a-z 0-9 . _ ~ + / = -"))
    reached = rhost.address if bind in ("0.0.0.0", "::") else bind
    errors += tls_problems(where, head.router, offline, head.router.server_name or reached, warnings)
    errors += client_key_problems(where, head.router.client_keys_env, head.api_key_env, offline, warnings)
    return errors


def tls_problems(where: str, choice, offline: bool, name: str = "",
                 warnings: list | None = None) -> list[tuple[str, str, str]]:
    """The front door's certificate and key (modelfleet.plan.inventory.tls): both or neither, and as a client and
    nginx would take them for clients reaching it as `name` (not read --offline); a certificate close to its
    end goes to `warnings`. Their contents are never shown. nginx serves a front door with TLS (behind_proxy)."""
    cert, key = choice.tls_cert, choice.tls_key
    if not cert and not key:
        return []
    if not (cert and key):
        given, missing = ("router_tls_cert", "router_tls_key") if cert else ("router_tls_key", "router_tls_cert")
        return [(where, missing, f"unset, but {given} is set: the front door needs both for TLS")]
    if offline:
        return []
    found, close = tls.problems(cert, key, name or choice.server_name or choice.bind_address or "")
    if warnings is not None:
        warnings += [(where, fld, message) for fld, message in close]
    return [(where, fld, message) for fld, message in found]


def client_key_problems(where: str, names: tuple[str, ...], model_key_env: str | None,
                        offline: bool, warnings: list | None = None) -> list[tuple[str, str, str]]:
    """The clients' keys of a front door (router_client_keys_env): each variable set on the control node, a key
    the proxy's config can hold, and none the replicas' own (values never shown) but `api_key_env`'s variable
    named on purpose: the shared key clients hold stays accepted while they move to keys of their own (a
    warning until it is taken out). nginx serves such a front door (behind_proxy)."""
    fld = "router_client_keys_env"
    if model_key_env in names and warnings is not None:
        warnings.append((where, fld, f"lists {model_key_env}, the replicas' key: clients still sending that shared "
                         "key are taken while they move to their own; take it out once they have (that key then "
                         f"gets 401 at the front door), then give {model_key_env} a new value"))
    if not names or offline:
        return []
    out, model_key = [], keys.stripped(model_key_env)
    for name in names:
        value = keys.stripped(name)
        if not value:
            out.append((where, fld, f"{name} is not set on the control node"))
        elif not PROXY_KEY.match(value):
            out.append((where, fld, f"the value of {name} (not shown) has characters the proxy's config cannot "
                        "hold: use 8-512 of A-Z a-z 0-9 . _ ~ + / = -"))
        elif value == model_key and name != model_key_env:
            out.append((where, fld, f"{name} holds the same key as {model_key_env}, the replicas' key that "
                        "clients must never see: give clients keys of their own (to keep taking the shared key "
                        f"while clients move, list {model_key_env} itself, then take it out)"))
    return out


def _bound(hosts: dict[str, HostPlan], svc):
    """A routed replica bound where only its router reaches it; behind a keyed proxy of its own host (on the
    fabric) where its engine's key leaves a model route open, the engine then on loopback."""
    address = _replica_address(hosts, svc, svc.router.host)
    if not _is_loopback(address) and door_needed(svc.engine_name) and not pd_role(svc.recipe, svc.engine_name):
        return replace(svc, bind_address="127.0.0.1", door_address=address)
    return replace(svc, bind_address=address)


def _pd_parts(pools: dict[str, PoolPlan]) -> dict[tuple[str, str], dict[str, list[str]]]:
    """(model, served name) -> part -> its pools ("name (recipe)"), for the models served by a PD layout."""
    parts: dict[tuple[str, str], dict[str, list[str]]] = {}
    for pool in pools.values():
        head = pool.services[0]
        role = pd_role(head.recipe, head.engine_name)
        if role:
            parts.setdefault((head.model.id, head.served_name), {"prefill": [], "decode": []})[role].append(
                f"{pool.name} ({head.recipe.id})")
    return parts


def pd_pairs(pools: dict[str, PoolPlan]) -> list[tuple[str, str, str]]:
    """A prefill pool serves nothing without a decode pool of the same model (the KV it computes has nowhere to
    go), and a decode pool nothing without a prefill pool: one error per model that has one part only."""
    out = []
    for (model, served), found in _pd_parts(pools).items():
        for have, lacks in (("prefill", "decode"), ("decode", "prefill")):
            if found[have] and not found[lacks]:
                out.append((f"model {model}", "recipe", f"{served}: the {have} part of a prefill/decode layout "
                            f"runs on {', '.join(found[have])}, but no pool serving {served} runs its {lacks} "
                            f"part: add one with a {lacks} recipe (both behind one router)"))
    return out


def front_door_name(served_name: str) -> str:
    """A front door is named after the model it serves (its unit and files are)."""
    return grammar.slug(served_name, "-")


def _replica_address(hosts: dict[str, HostPlan], svc, router_host: str) -> str:
    """Where a routed replica listens, and the router reaches it: loopback beside the router, else the fabric.
    A prefill/decode server always on the fabric: the router hands its address to the other part (SGLang's
    decode side fetches the KV from the bootstrap server at the prefill URL's host)."""
    if svc.host == router_host and not pd_role(svc.recipe, svc.engine_name):
        return "127.0.0.1"
    return hosts[svc.host].fabric_address or hosts[svc.host].address
