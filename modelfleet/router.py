"""One front door per model: the engine's own router (catalog/routers.yaml) on a host of the inventory, in front
of the model's replicas. Pure: the plan (from the inventory's `router*` settings), the files the router host
gets (launcher config, unit, the proxy's config where the router cannot check keys itself), and the worker
API's commands beside the parser of its answer. modelfleet.stages.router puts them on the host.

The router is started by a launcher (templates/router_launch.py.j2) that reads its flags from a JSON file, the
replicas from a file of URLs and the key from a 0600 file, and hands them to the router's own argument parser
in-process: the key is never in a command line. Replicas are added and removed through the worker API of the
running router (no restart); the URL file only says where a (re)started router begins.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Literal
from urllib.parse import quote, urlsplit

from pydantic import BaseModel, ConfigDict
from pyinfra.api import FactBase

from modelfleet import grammar, render
from modelfleet.catalog import CATALOG_DIR, read_yaml
from modelfleet.exposure import door_needed, key_coverage, routed_replica_problem
from modelfleet.host_commands import program
from modelfleet.inventory.plan import HostPlan, PoolPlan, RouterPlan, Worker, _is_loopback
from modelfleet.stages import TOOLS_BIN

UNIT_DIR = "/etc/systemd/system"
LAUNCHER = f"{TOOLS_BIN}/modelfleet_router.py"
NGINX = "/usr/sbin/nginx"
# The router drops a replica after this many failed /health checks this far apart (30 s), and takes it back
# after two good ones.
HEALTH_INTERVAL_S = 10
HEALTH_FAILURES = 3
# How long a worker-API change may take to show in the router's list (SGLang's router acts in the background).
REGISTER_WAIT_S = 60
# What a proxy front door can hold in its config: a bearer token's characters (RFC 6750 b64token).
PROXY_KEY = re.compile(r"^[A-Za-z0-9._~+/=-]{8,512}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorkerCall(_Strict):
    method: Literal["GET", "POST", "DELETE"]
    path: str
    body: dict[str, str] | None = None  # JSON body; `{url}` and `{model}` are the replica's URL and served name


class PdRole(_Strict):
    """How a recipe says which part of a PD layout its server plays: the value of `flag` (or of `key` in that
    flag's JSON) is `prefill` or `decode`'s."""

    flag: str
    key: str | None = None
    prefill: str
    decode: str


class PdBootstrap(_Strict):
    """A prefill server's bootstrap port (the engine's flag, and its default), which the router is told."""

    flag: str
    default: int


class PdSpec(_Strict):
    """The router's prefill/decode mode, and what the engine's servers get from the pool's fabric: `engine_env`
    and `engine_args` map a variable or flag to `address` (the member's own address), `hcas` (the derived
    HCAs, comma-separated) or `hca_ports` (the same with their ports, as NCCL_IB_HCA names them)."""

    source: str
    flag: str
    prefill_flag: str
    decode_flag: str
    role: PdRole
    bootstrap: PdBootstrap | None = None
    engine_env: dict[str, Literal["address", "hcas", "hca_ports"]] = {}
    engine_args: dict[str, Literal["address", "hcas", "hca_ports"]] = {}


class RouterSpec(_Strict):
    source: str
    package: str
    version: str
    module: str
    auth: Literal["router", "proxy"]  # who refuses a request without the key: the router, or a proxy before it
    args: list[str]
    worker_urls_flag: str
    host_flag: str
    port_flag: str
    api_key_flag: str
    admin_keys_flag: str | None = None  # the control plane's keys: set, the worker API takes modelfleet's key only
    start: Literal["flag", "api"]  # how a (re)started router gets its replicas: --worker-urls, or the worker API
    policies: list[str]
    inference_routes: list[str]  # what a key-less request must be refused on, at the front door
    workers: dict[Literal["list", "add", "remove"], WorkerCall]
    pd: PdSpec | None = None  # none: the router has no prefill/decode mode


@lru_cache(maxsize=1)
def specs() -> dict[str, RouterSpec]:
    """The routers catalog: engine -> its router."""
    data = read_yaml((CATALOG_DIR / "routers.yaml").read_text())
    return {engine: RouterSpec(**entry) for engine, entry in data.items()}


def spec(rp: RouterPlan) -> RouterSpec:
    return specs()[rp.engine_name]


def pd_spec(engine_name: str) -> PdSpec | None:
    entry = specs().get(engine_name)
    return entry.pd if entry else None


def _flag_value(args, flag: str) -> str | None:
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name == flag:
            return value if eq else (args[i + 1] if i + 1 < len(args) else None)
    return None


def pd_role(recipe, engine_name: str) -> str | None:
    """`prefill` or `decode` when the recipe's own flags make its server one part of a PD layout, else None."""
    pd = pd_spec(engine_name)
    value = _flag_value(recipe.args, pd.role.flag) if pd else None
    if value is not None and pd.role.key:
        try:
            value = json.loads(value).get(pd.role.key)
        except (ValueError, AttributeError):
            value = None
    return {pd.role.prefill: "prefill", pd.role.decode: "decode"}.get(value) if pd and value else None


def bootstrap_port(recipe, engine_name: str) -> int | None:
    """A prefill server's bootstrap port: the recipe's, else the engine's default (None: the engine has none)."""
    pd = pd_spec(engine_name)
    if not (pd and pd.bootstrap):
        return None
    given = _flag_value(recipe.args, pd.bootstrap.flag)
    return int(given) if given else pd.bootstrap.default


# -- the plan -------------------------------------------------------------------------------------------------


def _ip(value: str) -> bool:
    return grammar.address(value) is None


def _wildcard(address: str) -> bool:
    return ipaddress.ip_address(address).is_unspecified


def resolve(hosts: dict[str, HostPlan], pools: dict[str, PoolPlan], errors: list, reserved: dict[int, str],
            offline: bool = False) -> tuple[dict[str, HostPlan], dict[str, RouterPlan]]:
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
            continue
        if head.engine_name not in specs():
            errors.append((f"host {head.host}", "router", f"{head.engine_name} has no router in the catalog "
                           f"(routers: {', '.join(sorted(specs()))})"))
            continue
        for fld, value in (("engine", lambda s: s.engine_name), ("model", lambda s: s.model.id),
                           ("api_key_env", lambda s: s.api_key_env or ""), ("router_port", lambda s: s.router.port),
                           ("router_bind_address", lambda s: s.router.bind_address or ""),
                           ("router_policy", lambda s: s.router.policy),
                           ("router_tls_cert", lambda s: s.router.tls_cert or ""),
                           ("router_client_keys_env", lambda s: ",".join(s.router.client_keys_env)),
                           ("router_tls_key", lambda s: s.router.tls_key or "")):
            values = sorted({str(value(s)) for s in services})
            if len(values) > 1:
                errors.append((where, fld, f"the replicas of {served} disagree: {', '.join(values)}"))
        rhost = hosts[router_host]
        rspec = specs()[head.engine_name]
        roles = {s.pool: pd_role(s.recipe, s.engine_name) for s in services}
        if any(roles.values()) and not all(roles.values()):
            plain = sorted(p for p, role in roles.items() if not role)
            errors.append((where, "recipe", f"the front door of {served} pairs prefill and decode pools, but "
                           f"{', '.join(plain)} run a recipe of neither part: serve it under another name"))
        elif any(roles.values()) and set(roles.values()) != {"prefill", "decode"} and served not in lone:
            errors.append((where, "router", f"the front door of {served} on {router_host} has only "
                           f"{next(iter(set(roles.values())))} pools: its prefill and decode pools name one router"))
        if head.router.policy not in rspec.policies:
            errors.append((where, "router_policy", f"{head.router.policy} is not a policy of {rspec.package} "
                           f"(it has: {', '.join(rspec.policies)})"))
        bind = head.router.bind_address or rhost.address
        if not _ip(bind):
            errors.append((where, "router_bind_address", f"unset, and the router host's address {bind!r} is not "
                           "an IP address to listen on: set router_bind_address"))
        taken = {**reserved, rhost.ssh_port: "SSH", **{s.port: f"pool {s.pool}" for s in rhost.services}}
        for port, what in ((head.router.port, "the front door"), (head.router.port + 1, "the router behind it"),
                           (head.router.port + 2, "the router's metrics")):
            if port > 65535 or port in taken:
                errors.append((where, "router_port", f"{head.router.port}: port {port} ({what}) is "
                               f"{'out of range' if port > 65535 else 'used by ' + taken[port]} on {router_host}"))
        key = os.environ.get(head.api_key_env or "")
        proxied = rspec.auth == "proxy" or head.router.tls_cert or head.router.client_keys_env
        if proxied and key and not offline and not 8 <= len(key.strip()) <= 512:
            errors.append((where, "api_key_env", f"the value of {head.api_key_env} (not shown) is "
                           f"{len(key.strip())} characters long: the front door takes keys of 8 to 512"))
        elif proxied and key and not offline and not PROXY_KEY.match(key.strip()):
            errors.append((where, "api_key_env", f"the value of {head.api_key_env} (not shown) has characters the "
                           "proxy's config cannot hold: use 8-512 of A-Z a-z 0-9 . _ ~ + / = -"))
        if name in routers:
            errors.append((where, "router", f"{served} already has a front door on {routers[name].host}"))
        errors += tls_problems(where, head.router, offline)
        errors += client_key_problems(where, head.router.client_keys_env, head.api_key_env, offline)
        if len(errors) > problems:
            continue
        workers = tuple(Worker(pool=s.pool, host=s.host, url=f"http://{_replica_address(hosts, s, router_host)}:"
                               f"{s.port}", role=roles[s.pool],
                               bootstrap_port=bootstrap_port(s.recipe, s.engine_name) if roles[s.pool] == "prefill"
                               else None) for s in services if s.node_rank == 0)
        routers[name] = RouterPlan(name=name, host=router_host, engine_name=head.engine_name, served_name=served,
                                   bind_address=bind, port=head.router.port, policy=head.router.policy,
                                   api_key_env=head.api_key_env, config_dir=rhost.config_dir,
                                   workers=tuple(sorted(workers, key=lambda w: w.url)), pd=any(roles.values()),
                                   tls_cert=head.router.tls_cert, tls_key=head.router.tls_key,
                                   client_keys_env=head.router.client_keys_env)
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
    out = {}
    for name, plan in hosts.items():
        services = tuple(_bound(hosts, s) if s.router else s for s in plan.services)
        out[name] = replace(plan, services=services,
                            routers=tuple(rp for rp in routers.values() if rp.host == name))
    return out, routers


def tls_problems(where: str, choice, offline: bool) -> list[tuple[str, str, str]]:
    """The front door's certificate and key: both or neither, PEM files readable on the control node (not read
    --offline). Their contents are never shown. nginx serves a front door with TLS (behind_proxy)."""
    cert, key = choice.tls_cert, choice.tls_key
    if not cert and not key:
        return []
    if not (cert and key):
        given, missing = ("router_tls_cert", "router_tls_key") if cert else ("router_tls_key", "router_tls_cert")
        return [(where, missing, f"unset, but {given} is set: the front door needs both for TLS")]
    out = []
    for fld, path, marker in (("router_tls_cert", cert, "-----BEGIN CERTIFICATE-----"),
                              ("router_tls_key", key, "PRIVATE KEY-----")):
        if offline:
            continue
        try:
            text = Path(path).read_text(errors="replace")
        except OSError as error:
            out.append((where, fld, f"{path}: cannot be read on the control node ({error.strerror})"))
            continue
        if marker not in text:
            out.append((where, fld, f"{path}: not a PEM {'certificate' if fld == 'router_tls_cert' else 'private key'}"
                        " (contents not shown)"))
    return out


def client_key_problems(where: str, names: tuple[str, ...], model_key_env: str | None,
                        offline: bool) -> list[tuple[str, str, str]]:
    """The clients' keys of a front door (router_client_keys_env): each variable set on the control node, a key
    the proxy's config can hold, and none the replicas' own (values never shown). nginx serves such a front door
    (behind_proxy)."""
    fld = "router_client_keys_env"
    if not names:
        return []
    if offline:
        return []
    out, model_key = [], os.environ.get(model_key_env or "", "").strip()
    for name in names:
        value = os.environ.get(name, "").strip()
        if not value:
            out.append((where, fld, f"{name} is not set on the control node"))
        elif not PROXY_KEY.match(value):
            out.append((where, fld, f"the value of {name} (not shown) has characters the proxy's config cannot "
                        "hold: use 8-512 of A-Z a-z 0-9 . _ ~ + / = -"))
        elif value == model_key:
            out.append((where, fld, f"{name} holds the same key as {model_key_env}, the replicas' key that "
                        "clients must never see: give clients keys of their own"))
    return out


def client_keys(rp: RouterPlan) -> list[str]:
    """The keys the front door accepts: each of router_client_keys_env's, else the model's own."""
    if not rp.client_keys_env:
        return [api_key(rp)]
    return [os.environ[name].strip() for name in rp.client_keys_env]


def tls_files(rp: RouterPlan) -> dict[str, str]:
    """The router host's copies of the certificate chain and key (0600 each), read from the control node now."""
    if not rp.tls:
        return {}
    p = paths(rp)
    return {p["tls_cert"]: Path(rp.tls_cert).read_text(), p["tls_key"]: Path(rp.tls_key).read_text()}


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


# -- files on the router host ---------------------------------------------------------------------------------


def venv(rp: RouterPlan) -> str:
    """One venv per router release: a new version installs beside the old one, and the unit names it."""
    s = spec(rp)
    return f"/opt/modelfleet/router-{s.package}-{s.version}"


# The files beside a router's launcher config (router-NAME.json) and an nginx door's config (door-NAME.conf),
# by suffix: what the stage writes and what retiring the unit removes.
ROUTER_FILES = (".json", ".workers", ".key", ".admin", ".admin-auth")
DOOR_FILES = (".key.conf", ".crt", ".tls-key")


def paths(rp: RouterPlan) -> dict[str, str]:
    base, door = f"{rp.config_dir}/router-{rp.name}", f"{rp.config_dir}/door-{rp.name}"
    router_files = dict(zip(("config", "workers", "key", "admin", "admin_auth"), ROUTER_FILES, strict=True))
    door_files = dict(zip(("proxy_key", "tls_cert", "tls_key"), DOOR_FILES, strict=True))
    return {**{k: base + suffix for k, suffix in router_files.items()},
            **{k: door + suffix for k, suffix in door_files.items()}, "proxy": f"{door}.conf",
            "unit": f"{UNIT_DIR}/{rp.unit_name}", "proxy_unit": f"{UNIT_DIR}/{rp.proxy_unit_name}",
            "installed": f"{venv(rp)}/.modelfleet-installed"}


def behind_proxy(rp: RouterPlan) -> bool:
    """nginx is the front door (the router on loopback behind it): where the router checks no key itself, and for
    any router where clients have keys of their own or the door speaks TLS."""
    return spec(rp).auth == "proxy" or rp.tls or bool(rp.client_keys_env)


def listen(rp: RouterPlan) -> tuple[str, int]:
    """Where the router process itself listens: on loopback behind a proxy, else at the front door."""
    return ("127.0.0.1", rp.backend_port) if behind_proxy(rp) else (rp.bind_address, rp.port)


def local_url(rp: RouterPlan) -> str:
    """The router's own API as the router host reaches it (the worker API, its health)."""
    address, port = listen(rp)
    if _wildcard(address):
        address = "::1" if ":" in address else "127.0.0.1"
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


def router_args(rp: RouterPlan) -> list[str]:
    """The router's flags, but the replicas (the URL file) and the key (its file): the engine router's own."""
    s = spec(rp)
    address, port = listen(rp)
    values = {"policy": rp.policy, "health_interval_s": HEALTH_INTERVAL_S, "health_failures": HEALTH_FAILURES,
              "metrics_port": rp.metrics_port}
    return render.one_line_each([s.host_flag, address, s.port_flag, str(port),
                                 *(a.format(**values) for a in s.args), *pd_args(rp)])


def pd_args(rp: RouterPlan) -> list[str]:
    """A PD front door's servers, as the router's flags: every prefill server (with its bootstrap port where
    the engine has one), then every decode server."""
    if not rp.pd:
        return []
    pd = spec(rp).pd
    argv = [pd.flag]
    for w in rp.workers:
        if w.role == "prefill":
            argv += [pd.prefill_flag, w.url, *([str(w.bootstrap_port)] if w.bootstrap_port else [])]
    return argv + [arg for w in rp.workers if w.role == "decode" for arg in (pd.decode_flag, w.url)]


def launcher_config(rp: RouterPlan) -> str:
    """What the launcher reads: the router's flags, where the replicas and the key are, and how the router
    learns of the replicas when it starts (a flag, or the worker API once it answers)."""
    s, p = spec(rp), paths(rp)
    # A PD front door's servers are in its flags already (router_args).
    start = {} if rp.pd else {"worker_urls_flag": s.worker_urls_flag} if s.start == "flag" else {"register": {
        "health": f"{local_url(rp)}/health", "url": f"{local_url(rp)}{s.workers['add'].path}",
        "body": _body(rp, "add", "{url}")}}
    admin = {"admin_keys_flag": s.admin_keys_flag, "admin_key_file": p["admin"]} if s.admin_keys_flag else {}
    return json.dumps({"module": s.module, "args": router_args(rp), **start, "workers_file": p["workers"],
                       "api_key_flag": s.api_key_flag, "key_file": p["key"], **admin}, indent=1) + "\n"


def _body(rp: RouterPlan, call: str, url: str) -> dict[str, str] | None:
    template = spec(rp).workers[call].body
    return {k: v.replace("{url}", url).replace("{model}", rp.served_name) for k, v in template.items()} \
        if template else None


def workers_file(rp: RouterPlan) -> str:
    return "".join(f"{w.url}\n" for w in rp.workers)


def launcher() -> str:
    """The launcher script (stdlib only; the same for every router)."""
    return render.render_template("router_launch.py.j2")


def render_unit(rp: RouterPlan) -> str:
    s, p = spec(rp), paths(rp)
    argv = [f"{venv(rp)}/bin/python", LAUNCHER, p["config"]]
    return render.render_template("router.service.j2", rp=rp, spec=s, exec_start=render.exec_start(argv),
                                  front=f"{rp.bind_address}:{rp.port}")


def render_proxy(rp: RouterPlan, runtime: str | None = None) -> str:
    """nginx as the front door: every route needs the key (in the 0600 file it includes); the router's worker
    API is not served at all. `runtime`: its scratch directory (the unit's RuntimeDirectory)."""
    p = paths(rp)
    return render.render_template("door.nginx.conf.j2", rp=rp, runtime=runtime or f"/run/modelfleet-door-{rp.name}",
                                  key_conf=p["proxy_key"], backend=f"127.0.0.1:{rp.backend_port}",
                                  tls_cert=p["tls_cert"] if rp.tls else None, tls_key=p["tls_key"],
                                  upstream_auth=bool(rp.client_keys_env),
                                  listen=f"[{rp.bind_address}]:{rp.port}" if ":" in rp.bind_address
                                  else f"{rp.bind_address}:{rp.port}")


def proxy_key_conf(keys: str | list[str], upstream: str | None = None) -> str:
    """nginx's map from the Authorization header to 1 for each key clients may send. A map's plain strings match
    ignoring case, so each key is a case-sensitive regular expression (`~`), anchored at both ends, its `.` and
    `+` literal. `upstream`: the key the proxy sends on instead of the client's (the replicas' own)."""
    keys = [keys] if isinstance(keys, str) else keys
    if not keys or not all(PROXY_KEY.match(k) for k in [*keys, *([upstream] if upstream else [])]):
        raise ValueError("refusing to write a key the proxy's config cannot hold (value not shown)")
    lines = ["map $http_authorization $modelfleet_authorized {", "    default 0;"]
    lines += [f'    "~^Bearer {"".join(f"[{c}]" if c in ".+" else c for c in key)}$" 1;' for key in keys]
    lines.append("}")
    if upstream:
        lines += ["map $http_authorization $modelfleet_upstream_authorization {", f'    default "Bearer {upstream}";',
                  "}"]
    return "\n".join(lines) + "\n"


def render_proxy_unit(rp: RouterPlan) -> str:
    conf = paths(rp)["proxy"]
    return render.render_template("door.service.j2", rp=rp, nginx=NGINX, conf=conf,
                                  front=f"{rp.bind_address}:{rp.port}")


def key_files(rp: RouterPlan, key: str) -> dict[str, str]:
    """The 0600 file holding the clients' key, which the launcher hands to the router."""
    return {paths(rp)["key"]: key + "\n"}


def has_admin_key(rp: RouterPlan) -> bool:
    return bool(spec(rp).admin_keys_flag)


def admin_key_script(rp: RouterPlan) -> str:
    """Shell for the router host: the worker API's own key (modelfleet's only, never a client's), made once on the
    host into a 0600 file the launcher reads, beside the header file curl sends; each created with its final mode
    and renamed into place."""
    p = paths(rp)
    return program("router_admin_key", p["admin"], p["admin_auth"])


def api_key(rp: RouterPlan) -> str | None:
    value = os.environ.get(rp.api_key_env)
    return value.strip() if value else None


def summary(rp: RouterPlan) -> dict:
    """A front door as `validate --json` and `status --json` list it: where clients reach it and its replicas."""
    return {"name": rp.name, "host": rp.host, "bind_address": rp.bind_address, "port": rp.port,
            "url": f"{rp.base_url}/v1", "tls": rp.tls,
            "router": f"{spec(rp).package} {spec(rp).version}", "proxy": behind_proxy(rp),
            "client_keys_env": list(rp.client_keys_env or (rp.api_key_env,)),
            "replicas": [{"pool": w.pool, "host": w.host, "url": w.url} for w in rp.workers]}


def preview(rp: RouterPlan) -> tuple[list[dict], list[str]]:
    """(files, notes): every file the router stage writes for this front door on the router host, as `render`
    shows them (secrets masked: the clients' key, the private key; the worker API's key is made on the host)."""
    p, masked = paths(rp), f"{render.MASK}\n"
    files = [(LAUNCHER, launcher(), "0755"), (p["config"], launcher_config(rp), "0644"),
             (p["workers"], workers_file(rp), "0644"), (p["key"], masked, "0600"),
             (p["unit"], render_unit(rp), "0644")]
    if behind_proxy(rp):
        names = rp.client_keys_env or (rp.api_key_env,)
        conf = "".join(f"# {name}\n" for name in names) + "map $http_authorization $modelfleet_authorized {\n" \
            "    default 0;\n" + "".join(f'    "~^Bearer {render.MASK}$" 1;\n' for _ in names) + "}\n"
        if rp.client_keys_env:
            conf += (f"# {rp.api_key_env}, for the replicas\nmap $http_authorization "
                     f'$modelfleet_upstream_authorization {{\n    default "Bearer {render.MASK}";\n}}\n')
        files += [(p["proxy_key"], conf, "0600"), (p["proxy"], render_proxy(rp), "0644"),
                  (p["proxy_unit"], render_proxy_unit(rp), "0644")]
    if rp.tls:
        files += [(p["tls_cert"], Path(rp.tls_cert).read_text(), "0600"), (p["tls_key"], masked, "0600")]
    notes = [f"front door {rp.name}: {rp.base_url}/v1 for clients ("
             + (f"TLS with {rp.tls_cert}" if rp.tls else "plain HTTP: the key crosses the network in clear; set "
                "router_tls_cert and router_tls_key for TLS")
             + f"), {len(rp.workers)} replica(s): {', '.join(w.url for w in rp.workers)}"]
    if has_admin_key(rp):
        notes.append(f"front door {rp.name}: {p['admin']} and {p['admin_auth']} (0600), the worker API's key, are "
                     "made on the router host by the run, never on the control node")
    return [{"path": path, "mode": mode, "content": content} for path, content, mode in files], notes


# -- the worker API -------------------------------------------------------------------------------------------


def _curl(rp: RouterPlan, call: str, **values) -> str:
    """A curl of the router's worker API on the router host; its key (SGLang's control plane asks for it) comes
    from the 0600 header file, never the command line."""
    s = spec(rp).workers[call]
    auth = ["-H", f"@{paths(rp)['admin_auth']}"] if has_admin_key(rp) else []
    data = _body(rp, call, values.get("url", ""))
    body = ["-H", "Content-Type: application/json", "-d", json.dumps(data)] if data else []
    path = s.path.format(**{k: _quoted(v) for k, v in values.items()})
    return shlex.join(["curl", "-fsS", "-m", "10", "-X", s.method, *auth, *body, f"{local_url(rp)}{path}"])


def _quoted(value: str) -> str:
    return quote(value, safe="")


def list_command(rp: RouterPlan) -> str:
    """The router's workers as JSON, or nothing when the router does not answer."""
    return f"{_curl(rp, 'list')} 2>/dev/null || true"


def workers_echo(rp: RouterPlan) -> str:
    """Shell: `workers=<the router's list on one line>` (nothing after `=` when the router does not answer)."""
    return f"echo \"workers=$({{ {list_command(rp)}; }} | tr -d '\\n')\""


def listed(value: str) -> dict[str, dict] | None:
    """The replicas a `workers=` value lists (parse_workers); None when the router did not answer or answered
    something that is not its list."""
    try:
        return parse_workers(value)
    except (ValueError, KeyError, TypeError):
        return None


def parse_workers(output: str) -> dict[str, dict] | None:
    """url -> {"id", "healthy"} from either router's list ({"workers": [...]}: SGLang's router names each by an
    id, vLLM's by its URL; or vLLM's /list_workers {"urls": [...]}); None when the router did not answer."""
    output = output.strip()
    if not output:
        return None
    data = json.loads(output)
    if "urls" in data:
        return {url: {"id": url, "healthy": None} for url in data["urls"]}
    return {w["url"]: {"id": w.get("id", w["url"]), "healthy": w.get("is_healthy")} for w in data["workers"]}


def _pd_refused(rp: RouterPlan, url: str, what: str) -> str:
    return (f"echo 'modelfleet: front door {rp.name} pairs prefill and decode servers given when it starts: "
            f"{what} {url} through its worker API would lose its part; converge to restart the router' >&2; exit 1")


def _worker_program(rp: RouterPlan, action: str, url: str, call: str) -> str:
    return program("router_worker", action, rp.name, url, REGISTER_WAIT_S,
                   functions={"worker_call": call, "list_workers": _curl(rp, "list")})


def add_script(rp: RouterPlan, url: str) -> str:
    """Add a replica once it answers /health from the router host, then wait until the router lists it."""
    if rp.pd:
        return _pd_refused(rp, url, "adding")
    return _worker_program(rp, "add", url, _curl(rp, "add", url=url))


def remove_script(rp: RouterPlan, url: str, worker_id: str) -> str:
    """Take a replica out of the router (in-flight requests finish on it), then wait until it is gone."""
    if rp.pd:
        return _pd_refused(rp, url, "taking out")
    return _worker_program(rp, "remove", url, _curl(rp, "remove", url=url, id=worker_id))


def replica_probes(rp: RouterPlan) -> list[tuple[str, str]]:
    """(replica host, URL) the router host asks without the key: every replica off loopback, on
    /v1/chat/completions, its engine's own inference route and every route its key leaves open that runs the
    model. A replica on the router host's loopback is not beyond it: none of its routes is asked here."""
    coverage = key_coverage().get(rp.engine_name)
    routes = ["/v1/chat/completions", *([coverage.probe_route, *coverage.open_inference_routes] if coverage else [])]
    return [(w.host, f"{w.url}{route}") for w in rp.workers if not _is_loopback(urlsplit(w.url).hostname or "")
            for route in dict.fromkeys(routes)]


def replica_exposure_script(rp: RouterPlan) -> str | None:
    """Shell for the router host: each of replica_probes refuses a key-less request (exit 1 naming the replica's
    host and route otherwise); None when every replica is on loopback."""
    probes = replica_probes(rp)
    if not probes:
        return None
    body = json.dumps({"model": rp.served_name, "messages": [{"role": "user", "content": "Say hi."}],
                       "prompt": "Say hi.", "text": "Say hi.", "input": "Say hi.", "max_tokens": 1})
    return program("replica_exposure", rp.name, body, *(part for probe in probes for part in probe))


def health_script(rp: RouterPlan, timeout_s: int = 60) -> str:
    """The router answers /health on the router host."""
    return program("router_health", rp.name, f"{local_url(rp)}/health", timeout_s)


class RouterWorkers(FactBase):
    """The replicas a running router lists (parse_workers), or None when it does not answer."""

    def command(self, rp: RouterPlan):
        return list_command(rp)

    def requires_command(self, *args, **kwargs):
        return "curl"

    def process(self, output):
        return parse_workers("\n".join(output))
