"""One front door per model: the engine's own router (catalog/routers.yaml) on a host of the inventory, in front
of the model's replicas. Pure: the files the router host gets (launcher config, unit, the proxy's config where
the router cannot check keys itself), and the worker API's commands beside the parser of its answer.
modelfleet.run.stages.router puts them on the host. The routers catalog is modelfleet.plan.catalog.routers and the plan
(from the inventory's `router*` settings, checked) modelfleet.plan.inventory.routed; their names are re-exported here.

The router is started by a launcher (templates/router_launch.py.j2) that reads its flags from a JSON file, the
replicas from a file of URLs and the key from a 0600 file, and hands them to the router's own argument parser
in-process: the key is never in a command line. Replicas are added and removed through the worker API of the
running router (no restart); the URL file only says where a (re)started router begins. A router that watches a
manifest of its replicas (smg: `start: file`) gets none of those calls: modelfleet rewrites the unit's copy of
the manifest (render_manifest, edit_manifest_script) and the router re-reads it.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

from pyinfra.api import FactBase

from modelfleet.base import grammar, keys
from modelfleet.base.host_commands import TOOLS_BIN, program
from modelfleet.plan import render
from modelfleet.plan.catalog import CATALOG_DIR, load_catalog
from modelfleet.plan.catalog.routers import (  # noqa: F401  (re-exported: callers name them modelfleet.plan.router.*)
    PdBootstrap,
    PdRole,
    PdSpec,
    RouterSpec,
    WorkerCall,
    bootstrap_port,
    pd_role,
    pd_spec,
    spec,
    specs,
)
from modelfleet.plan.exposure import key_coverage
from modelfleet.plan.inventory.plan import RouterPlan, _is_loopback
from modelfleet.plan.inventory.routed import (  # noqa: F401  (re-exported, as above)
    PROXY_KEY,
    _wildcard,
    client_key_problems,
    front_door_name,
    pd_pairs,
    resolve,
    tls_problems,
)

UNIT_DIR = "/etc/systemd/system"
LAUNCHER = f"{TOOLS_BIN}/modelfleet_router.py"
NGINX = "/usr/sbin/nginx"
# The router drops a replica after this many failed /health checks this far apart (30 s), and takes it back
# after two good ones.
HEALTH_INTERVAL_S = 10
HEALTH_FAILURES = 3
# How long a worker-API change may take to show in the router's list (SGLang's router acts in the background).
REGISTER_WAIT_S = 60
# Dedicated system users: the front door's nginx workers, and the router itself (modelfleet's own calls to its
# API are made as this user too). A router whose API has no key lets only these two connect to its port.
DOOR_USER = "modelfleet-door"
ROUTER_USER = "modelfleet-router"
USERS = (DOOR_USER, ROUTER_USER)
NFT = "/usr/sbin/nft"
# Where systemd makes a unit's RuntimeDirectory: the router's copies of its files, its live manifest among them.
RUNTIME_ROOT = "/run"


def client_key_names(rp: RouterPlan) -> tuple[str, ...]:
    """The control-node variables of the keys clients send: router_client_keys_env's, else the model's own."""
    return rp.client_keys_env or (rp.api_key_env,)


def client_keys(rp: RouterPlan) -> list[str]:
    """The keys the front door accepts (client_key_names' values)."""
    if not rp.client_keys_env:
        return [api_key(rp)]
    return [keys.required(name) for name in rp.client_keys_env]


def tls_files(rp: RouterPlan) -> dict[str, str]:
    """The router host's copies of the certificate chain and key (0600 each), read from the control node now."""
    if not rp.tls:
        return {}
    p = paths(rp)
    return {p["tls_cert"]: Path(rp.tls_cert).read_text(), p["tls_key"]: Path(rp.tls_key).read_text()}


# -- files on the router host ---------------------------------------------------------------------------------


def venv(rp: RouterPlan) -> str:
    """One venv per router release: a new version installs beside the old one, and the unit names it."""
    s = spec(rp)
    return f"/opt/modelfleet/router-{s.package}-{s.version}"


def lock(s: RouterSpec) -> str:
    """The router release and every wheel it installs, pinned with their sha256s (catalog/router_locks/)."""
    return (CATALOG_DIR / "router_locks" / f"{s.package}-{s.version}.txt").read_text()


def install_command(rp: RouterPlan, index_url: str | None = None) -> list[str]:
    """The venv (built afresh) and pip's install of lock() (on the host at paths()["lock"]): hashes required,
    wheels only; from `index_url` (the host's router_pip_index_url) instead of PyPI where given. The marker is
    a copy of the lock it was built from: a venv of another lock (or of an older modelfleet's bare marker) is
    built again."""
    v, p = venv(rp), paths(rp)
    return ["python3", "-m", "venv", "--clear", v, "&&", f"{v}/bin/pip", "install", "-q",
            "--disable-pip-version-check", "--require-hashes", "--only-binary=:all:", *index_args(index_url),
            "-r", p["lock"], "&&",
            "cp", "-f", p["lock"], p["installed"]]


def index_args(index_url: str | None) -> list[str]:
    """pip's arguments for router_pip_index_url: a file:// URL is a folder of wheels on the host (pip reads
    one only as --find-links, and nothing else then); a plain-HTTP index off loopback is one pip ignores unless
    trusted (the lock's hashes still check every file it serves)."""
    if not index_url:
        return []
    parts = urlsplit(index_url)
    if parts.scheme == "file":
        return ["--no-index", "--find-links", unquote(parts.path)]
    host = parts.hostname or ""
    if parts.scheme == "http" and not (host == "localhost" or (grammar.address(host) is None and
                                                               ipaddress.ip_address(host).is_loopback)):
        return ["--index-url", index_url, "--trusted-host", parts.netloc]
    return ["--index-url", index_url]


# The files beside a router's launcher config (router-NAME.json) and an nginx door's config (door-NAME.conf),
# by suffix: what the stage writes and what retiring the unit removes.
ROUTER_FILES = (".json", ".workers", ".key", ".admin", ".admin-auth", ".nft")
DOOR_FILES = (".key.conf", ".crt", ".tls-key")


def paths(rp: RouterPlan) -> dict[str, str]:
    base, door = f"{rp.config_dir}/router-{rp.name}", f"{rp.config_dir}/door-{rp.name}"
    router_files = dict(zip(("config", "workers", "key", "admin", "admin_auth", "rule"), ROUTER_FILES,
                            strict=True))
    door_files = dict(zip(("proxy_key", "tls_cert", "tls_key"), DOOR_FILES, strict=True))
    return {**{k: base + suffix for k, suffix in router_files.items()},
            **{k: door + suffix for k, suffix in door_files.items()}, "proxy": f"{door}.conf",
            "unit": f"{UNIT_DIR}/{rp.unit_name}", "proxy_unit": f"{UNIT_DIR}/{rp.proxy_unit_name}",
            "installed": f"{venv(rp)}/.modelfleet-installed", "lock": f"{venv(rp)}.requirements.txt"}


def behind_proxy(rp: RouterPlan) -> bool:
    """nginx is the front door (the router on loopback behind it): where the router checks no key itself, and for
    any router where clients have keys of their own or the door speaks TLS."""
    return spec(rp).auth == "proxy" or rp.tls or bool(rp.client_keys_env)


def owner_only(rp: RouterPlan) -> bool:
    """The router answers its own port (its worker API, every model route) to any caller without a key (vLLM's):
    only the door's and the router's users may connect to it, and modelfleet's calls run as the router's user."""
    return spec(rp).auth == "proxy"


def firewalled(rp: RouterPlan) -> bool:
    """The router's unit loads the owner rule (render_rule): unless the host cannot take nftables rules
    (`router_worker_firewall = false`, e.g. a container without NET_ADMIN, as the lab's hosts)."""
    return owner_only(rp) and rp.worker_firewall


def nft_table(rp: RouterPlan) -> str:
    """The owner rule's nftables table: the router unit's own name."""
    return rp.unit_name.removesuffix(".service")


def render_rule(rp: RouterPlan) -> str:
    """The nftables table the router's unit loads before the router starts (and deletes when it stops): a
    connection to the router's port on loopback from a socket whose owner is neither the door's nor the router's
    user is reset. Loaded with `nft -f`, atomically: an older copy of the table is replaced, never doubled."""
    table = f"inet {nft_table(rp)}"
    return (f"# Managed by modelfleet - do not edit; re-run the deploy instead.\n"
            f"# front door {rp.name}: only {DOOR_USER} (nginx's workers) and {ROUTER_USER} (the router, modelfleet's "
            f"worker calls)\n# connect to the router on 127.0.0.1:{rp.backend_port}, which has no key of its own.\n"
            f"table {table}\ndelete table {table}\ntable {table} {{\n    chain output {{\n"
            f"        type filter hook output priority 0; policy accept;\n"
            f'        oifname "lo" tcp dport {rp.backend_port} meta skuid != {{ "{DOOR_USER}", "{ROUTER_USER}" }} '
            f"reject with tcp reset\n    }}\n}}\n")


def as_router(rp: RouterPlan, command: str) -> str:
    """`command` (shell) run as the router's user where only that user may reach the router's API."""
    if not owner_only(rp):
        return command
    return f"setpriv --reuid={ROUTER_USER} --regid={ROUTER_USER} --clear-groups -- {command}"


def users_script(users: tuple[str, ...] = USERS) -> str:
    """Shell: the system users, each with a group of its own, no home and no login shell (an existing one kept)."""
    return " && ".join(f"{{ getent passwd {u} >/dev/null || useradd --system --user-group --no-create-home "
                       f"--home-dir /nonexistent --shell /usr/sbin/nologin {u}; }}" for u in users)


def worker_guard_script(rp: RouterPlan) -> str | None:
    """The verify gate's look at the router's own port from the router host (firewalled routers only): the
    router's user gets its worker list, a process of user nobody gets its connection refused."""
    if not firewalled(rp):
        return None
    return program("router_worker_guard", rp.name, f"{local_url(rp)}{spec(rp).workers['list'].path}", ROUTER_USER,
                   nft_table(rp))


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
    # A PD front door's servers are in its flags already (router_args). A watched manifest: the launcher
    # names the file it was handed (`{manifest}`), which is where modelfleet rewrites it.
    values = {"health_interval_s": HEALTH_INTERVAL_S, "manifest": "{manifest}"}
    start = {} if rp.pd else {"worker_urls_flag": s.worker_urls_flag} if s.start == "flag" else {
        "discovery_args": [a.format(**values) for a in s.discovery_args]} if s.start == "file" else {"register": {
            "health": f"{local_url(rp)}/health", "url": f"{local_url(rp)}{s.workers['add'].path}",
            "body": _body(rp, "add", "{url}")}}
    admin = {"admin_keys_flag": s.admin_keys_flag, "admin_key_file": p["admin"]} if s.admin_keys_flag else {}
    return json.dumps({"module": s.module, "args": router_args(rp), **start, "workers_file": p["workers"],
                       "api_key_flag": s.api_key_flag, "key_file": p["key"], **admin}, indent=1) + "\n"


def _body(rp: RouterPlan, call: str, url: str) -> dict[str, str] | None:
    template = spec(rp).workers[call].body
    return {k: v.replace("{url}", url).replace("{model}", rp.served_name) for k, v in template.items()} \
        if template else None


def watches_manifest(rp: RouterPlan) -> bool:
    """The router reads its replicas from a manifest it watches (smg), not from calls to its worker API."""
    return spec(rp).start == "file" and not rp.pd


def render_manifest(rp: RouterPlan, urls: list[str]) -> str:
    """smg's discovery manifest: each replica by URL, under the served name (what /v1/models lists)."""
    workers = [{"url": url, "model_id": rp.served_name} for url in urls]
    return json.dumps({"version": 1, "workers": workers}, indent=1) + "\n"


def workers_file(rp: RouterPlan) -> str:
    """Where a (re)started router begins: its manifest (watches_manifest), else one replica URL a line."""
    if watches_manifest(rp):
        return render_manifest(rp, [w.url for w in rp.workers])
    return "".join(f"{w.url}\n" for w in rp.workers)


def runtime_dir(rp: RouterPlan) -> str:
    return f"{RUNTIME_ROOT}/{rp.unit_name.removesuffix('.service')}"


def live_manifest(rp: RouterPlan) -> str:
    """The manifest the running router watches: the unit's copy of workers_file in its runtime directory."""
    return f"{runtime_dir(rp)}/{Path(paths(rp)['workers']).name}"


# Run as root on the router host: one replica put into or taken out of the live manifest. The directory is the
# router user's: the file is read without following a link, the new one made beside it (O_EXCL, a random
# name), given the directory's owner and mode 0400 through its descriptor, then renamed over the old one.
_EDIT_MANIFEST = """
import json, os, stat, sys, tempfile
action, path, url, model = sys.argv[1:5]
folder = os.path.dirname(path)
info = os.lstat(folder)
if not stat.S_ISDIR(info.st_mode):
    sys.exit(f"modelfleet: {folder} is not a directory: the router's manifest not changed")
try:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
except OSError as error:
    sys.exit(f"modelfleet: cannot read the router's manifest {path}: {error.strerror}")
with os.fdopen(fd) as f:
    manifest = json.load(f)
workers = [w for w in manifest["workers"] if w.get("url") != url]
if action == "add":
    workers.append({"url": url, "model_id": model})
fd, tmp = tempfile.mkstemp(dir=folder, prefix=".manifest-")
try:
    os.fchown(fd, info.st_uid, info.st_gid)
    os.fchmod(fd, 0o400)
    with os.fdopen(fd, "w") as f:
        json.dump(dict(manifest, workers=workers), f, indent=1)
        f.write("\\n")
    os.replace(tmp, path)
except BaseException:
    os.unlink(tmp)
    raise
"""


def edit_manifest_script(rp: RouterPlan, action: str, url: str) -> str:
    """Shell: `url` added to (or removed from) the manifest the running router watches (root, on its host)."""
    return shlex.join(["python3", "-c", _EDIT_MANIFEST.strip(), action, live_manifest(rp), url, rp.served_name])


def launcher() -> str:
    """The launcher script (stdlib only; the same for every router)."""
    return render.render_template("router_launch.py.j2")


def handed(rp: RouterPlan) -> list[str]:
    """The root-only files the router's unit copies for its user (by file name, into its runtime directory): the
    launcher's config, the replicas, the key, the worker API's key where the router has one."""
    p = paths(rp)
    return [p["config"], p["workers"], p["key"], *([p["admin"]] if has_admin_key(rp) else [])]


def render_unit(rp: RouterPlan) -> str:
    s, p = spec(rp), paths(rp)
    # The launcher reads each file from the unit's runtime directory (copies for the router's user), by name.
    argv = [f"{venv(rp)}/bin/python", LAUNCHER, p["config"]]
    return render.render_template("router.service.j2", rp=rp, spec=s, exec_start=render.exec_start(argv),
                                  front=f"{rp.bind_address}:{rp.port}", user=ROUTER_USER, nft=NFT,
                                  rule=p["rule"] if firewalled(rp) else None, table=nft_table(rp),
                                  runtime=rp.unit_name.removesuffix(".service"),
                                  handed=[render.systemd_quote(path) for path in handed(rp)])


def render_proxy(rp: RouterPlan, runtime: str | None = None) -> str:
    """nginx as the front door: every route needs the key (in the 0600 file it includes); the router's worker
    API is not served at all. `runtime`: its scratch directory (the unit's RuntimeDirectory)."""
    p = paths(rp)
    return render.render_template("door.nginx.conf.j2", rp=rp, runtime=runtime or f"/run/modelfleet-door-{rp.name}",
                                  key_conf=p["proxy_key"], backend=f"127.0.0.1:{rp.backend_port}",
                                  user=DOOR_USER, routes=client_route_pattern(rp),
                                  tls_cert=p["tls_cert"] if rp.tls else None, tls_key=p["tls_key"],
                                  upstream_auth=bool(rp.client_keys_env),
                                  listen=f"[{rp.bind_address}]:{rp.port}" if ":" in rp.bind_address
                                  else f"{rp.bind_address}:{rp.port}")


def client_route_pattern(rp: RouterPlan) -> str:
    """The paths a client's key opens at an nginx front door (the router's inference_routes and client_routes),
    as one regular expression over the request line's own path (nginx's $request_uri, not its normalised $uri:
    what is matched is what the router gets). `{id}` stands for one path segment."""
    s = spec(rp)
    alternatives = [re.escape(route).replace(re.escape("{id}"), "[^/?%]+")
                    for route in dict.fromkeys([*s.inference_routes, *s.client_routes])]
    return f"^({'|'.join(alternatives)})(\\?|$)"


def proxy_key_conf(keys: str | list[str], upstream: str | None = None, names: tuple[str, ...] = (),
                   upstream_name: str | None = None, mask: bool = False) -> str:
    """nginx's map from the Authorization header to 1 for each key clients may send. A map's plain strings match
    ignoring case, so each key is a case-sensitive regular expression (`~`), anchored at both ends, its `.` and
    `+` literal. `upstream`: the key the proxy sends on instead of the client's (the replicas' own). `names` and
    `upstream_name`: the variables they come from, as comments; `mask`: each key shown as the mask (render)."""
    keys = [keys] if isinstance(keys, str) else keys
    if not mask and (not keys or not all(PROXY_KEY.match(k) for k in [*keys, *([upstream] if upstream else [])])):
        raise ValueError("refusing to write a key the proxy's config cannot hold (value not shown)")
    shown = (lambda key: render.MASK) if mask else (lambda key: "".join(f"[{c}]" if c in ".+" else c for c in key))
    lines = [f"# {name}" for name in names] + ["map $http_authorization $modelfleet_authorized {", "    default 0;"]
    lines += [f'    "~^Bearer {shown(key)}$" 1;' for key in keys]
    lines.append("}")
    if upstream:
        lines += [f"# {upstream_name}, for the replicas"] if upstream_name else []
        lines += ["map $http_authorization $modelfleet_upstream_authorization {",
                  f'    default "Bearer {render.MASK if mask else upstream}";', "}"]
    return "\n".join(lines) + "\n"


def proxy_key_file(rp: RouterPlan, mask: bool = False) -> str:
    """The front door's key map as the router host gets it (`mask`: as render shows it): the clients' keys, and
    the replicas' own where the clients have keys of their own."""
    names = client_key_names(rp)
    upstream = bool(rp.client_keys_env)
    values = [render.MASK] * len(names) if mask else client_keys(rp)
    return proxy_key_conf(values, (render.MASK if mask else api_key(rp)) if upstream else None, names,
                          rp.api_key_env if upstream else None, mask=mask)


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
    value = keys.from_env(rp.api_key_env)
    return value.strip() if value else None


def summary(rp: RouterPlan) -> dict:
    """A front door as `validate --json` and `status --json` list it: where clients reach it and its replicas."""
    return {"name": rp.name, "host": rp.host, "bind_address": rp.bind_address, "port": rp.port,
            "url": f"{rp.base_url}/v1", "tls": rp.tls,
            "router": f"{spec(rp).package} {spec(rp).version}", "proxy": behind_proxy(rp),
            "client_keys_env": list(client_key_names(rp)),
            "replicas": [{"pool": w.pool, "host": w.host, "url": w.url} for w in rp.workers]}


def preview(rp: RouterPlan) -> tuple[list[dict], list[str]]:
    """(files, notes): every file the router stage writes for this front door on the router host, as `render`
    shows them (secrets masked: the clients' key, the private key; the worker API's key is made on the host)."""
    p, masked = paths(rp), f"{render.MASK}\n"
    files = [(p["lock"], lock(spec(rp)), "0644"), (LAUNCHER, launcher(), "0755"),
             (p["config"], launcher_config(rp), "0644"),
             (p["workers"], workers_file(rp), "0644"), (p["key"], masked, "0600"),
             *([(p["rule"], render_rule(rp), "0600")] if firewalled(rp) else []),
             (p["unit"], render_unit(rp), "0644")]
    if behind_proxy(rp):
        files += [(p["proxy_key"], proxy_key_file(rp, mask=True), "0600"), (p["proxy"], render_proxy(rp), "0644"),
                  (p["proxy_unit"], render_proxy_unit(rp), "0644")]
    if rp.tls:
        files += [(p["tls_cert"], Path(rp.tls_cert).read_text(), "0600"), (p["tls_key"], masked, "0600")]
    notes = [f"front door {rp.name}: {rp.base_url}/v1 for clients ("
             + (f"TLS with {rp.tls_cert}" if rp.tls else "plain HTTP: the key crosses the network in clear; set "
                "router_tls_cert and router_tls_key for TLS")
             + f"), {len(rp.workers)} replica(s): {', '.join(w.url for w in rp.workers)}"]
    notes.append(f"front door {rp.name}: the router runs as {ROUTER_USER}" + (f", nginx's workers as {DOOR_USER}"
                 if behind_proxy(rp) else "") + " (system users the run creates)" + (
                 f"; only they reach the router on 127.0.0.1:{rp.backend_port} ({p['rule']})" if firewalled(rp) else
                 f"; router_worker_firewall is off: any local process reaches the router on 127.0.0.1:"
                 f"{rp.backend_port}" if owner_only(rp) else ""))
    if watches_manifest(rp):
        notes.append(f"front door {rp.name}: {spec(rp).package} reads its replicas from {live_manifest(rp)} (the "
                     f"unit's copy of {p['workers']}); a replica joining or leaving rewrites it, the router is not "
                     "restarted")
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
    return as_router(rp, shlex.join(["curl", "-fsS", "-m", "10", "-X", s.method, *auth, *body,
                                     f"{local_url(rp)}{path}"]))


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
    call = edit_manifest_script(rp, "add", url) if watches_manifest(rp) else _curl(rp, "add", url=url)
    return _worker_program(rp, "add", url, call)


def remove_script(rp: RouterPlan, url: str, worker_id: str) -> str:
    """Take a replica out of the router (in-flight requests finish on it), then wait until it is gone."""
    if rp.pd:
        return _pd_refused(rp, url, "taking out")
    call = edit_manifest_script(rp, "remove", url) if watches_manifest(rp) else _curl(rp, "remove", url=url,
                                                                                      id=worker_id)
    return _worker_program(rp, "remove", url, call)


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


def replicas_ready_script(rp: RouterPlan, timeout_s: int = 120) -> str:
    """Shell for the router host: every replica answers its engine's health path where the router reaches it,
    within `timeout_s` in all (exit 1 and one line naming those that do not)."""
    health = load_catalog().engines[rp.engine_name].health_path
    return program("replicas_ready", rp.name, timeout_s, *(part for w in rp.workers for part in (w.host,
                                                                                                 f"{w.url}{health}")))


def health_script(rp: RouterPlan, timeout_s: int = 60) -> str:
    """The router answers /health on the router host."""
    return as_router(rp, program("router_health", rp.name, f"{local_url(rp)}/health", timeout_s))


class RouterWorkers(FactBase):
    """The replicas a running router lists (parse_workers), or None when it does not answer."""

    def command(self, rp: RouterPlan):
        return list_command(rp)

    def requires_command(self, *args, **kwargs):
        return "curl"

    def process(self, output):
        return parse_workers("\n".join(output))
