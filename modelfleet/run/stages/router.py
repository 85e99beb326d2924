"""Stage router: on a host that runs a model's front door (modelfleet.plan.router), the engine's router from its
wheel in a venv, its launcher, config and key files, its systemd unit (and nginx before it where the router
cannot check keys itself), then the router's list of replicas kept equal to the inventory's through its
worker API: a new replica is added once it answers, a removed one is taken out, and neither the router nor
the other replicas restart; then the verify gate through the front door (every inference route of the router
asked without the key). Runs after the service stage, so the replicas of this run are ready by then."""

from __future__ import annotations

import hashlib
import shlex
from contextlib import nullcontext
from dataclasses import replace
from urllib.parse import urlsplit

from pyinfra import host, state
from pyinfra.api import FunctionCommand, StringCommand, deploy, operation

from modelfleet.base.host_commands import TOOLS_BIN
from modelfleet.host import os as osfam
from modelfleet.host.operations.files import content_changes, content_file, directory
from modelfleet.host.operations.owned_unit import owned_running, refused_when_kept, unmasked
from modelfleet.host.operations.report import fail_host, note, refuse, reports_dir, save_report
from modelfleet.plan import render, replica_door, router
from modelfleet.plan.inventory.plan import HostPlan, RouterPlan, _is_loopback
from modelfleet.run.checks import Endpoint, exposure
from modelfleet.run.checks.gate import run_gate
from modelfleet.run.checks.tunnel import through_host
from modelfleet.run.context import HostRun

NAME = "router"
PINS: frozenset[str] = frozenset()

PROXY_PACKAGE = "nginx"


def wanted_packages(plan: HostPlan, os_info: dict | None = None) -> dict[str, None]:
    """A router's venv and checks need the OS family's `router_base` packages; its owner rule, `router_firewall`'s;
    a proxy, nginx."""
    proxy = any(router.behind_proxy(rp) for rp in plan.routers) or bool(replica_door.doors(plan))
    names = osfam.family(os_info).names
    firewall = any(router.firewalled(rp) for rp in plan.routers)
    return dict.fromkeys(list(names("router_base")) * bool(plan.routers) + list(names("router_firewall")) * firewall
                         + [PROXY_PACKAGE] * proxy)


def wants(plan: HostPlan, probe: dict) -> dict:
    doors = replica_door.doors(plan)
    if not plan.routers and not doors:
        return {}
    paths = [plan.config_dir, *([TOOLS_BIN, router.LAUNCHER] if plan.routers else [])]
    paths += [path for rp in plan.routers for path in router.paths(rp).values()]
    paths += [path for svc in doors for path in replica_door.paths(svc).values()]
    units = [unit for rp in plan.routers
             for unit in (rp.unit_name, *([rp.proxy_unit_name] if router.behind_proxy(rp) else []))]
    units += [replica_door.unit_name(svc) for svc in doors]
    return {"paths": paths, "units": units, "packages": list(wanted_packages(plan, probe.get("os"))),
            "users": list(router.USERS) if plan.routers else []}


@operation()
def venv_installed(venv: str, requirement: str, command: list[str], present: bool):
    """A venv the stage owns with a router release and its dependencies, every wheel's hash checked
    (router.install_command); marked only once pip succeeded."""
    if present:
        host.noop(f"{venv} has {requirement}")
        return
    yield StringCommand(*(arg if arg in ("&&",) else shlex.quote(arg) for arg in command))


@operation()
def users_present(users: list[str], missing: list[str]):
    """The front door's system users (router.users_script); the caller says which the host lacks."""
    if not missing:
        host.noop(f"users {', '.join(users)} exist")
        return
    yield StringCommand(router.users_script(tuple(missing)))


@operation()
def admin_key_made(script: str):
    """The worker API's own key on the router host (router.admin_key_script); the caller asks only when absent."""
    yield StringCommand(script)


@operation(is_idempotent=False)
def router_answers(script: str):
    """The router (re)started by this run answers on the router host."""
    yield StringCommand(script)


@operation()
def proxy_reloaded(unit: str, reload: bool):
    """nginx rereads its config (a new key): open connections are kept."""
    if not reload:
        host.noop(f"{unit} runs its current config")
        return
    yield StringCommand("systemctl", "reload", unit)


@operation()
def workers_registered(front_door: str, remove: dict[str, str], add: dict[str, str]):
    """
    The router's replicas equal to the inventory's: `remove` and `add` map a replica's URL to the worker-API
    script that takes it out or puts it in (modelfleet.plan.router); removals first, so a replica that moved to
    another address is never listed twice.
    """
    if not remove and not add:
        host.noop(f"router {front_door} lists every replica of the inventory, and no other")
        return
    for url, script in sorted(remove.items()):
        yield FunctionCommand(note, (f"modelfleet: router {front_door}: taking {url} out (not in the inventory)",), {})
        yield StringCommand(script)
    for url, script in sorted(add.items()):
        yield FunctionCommand(note, (f"modelfleet: router {front_door}: adding {url}",), {})
        yield StringCommand(script)


def registration(rp: RouterPlan, listed: dict[str, dict]) -> tuple[dict[str, str], dict[str, str]]:
    """(remove, add): the worker-API scripts that make the router's list `listed` the inventory's."""
    wanted = {w.url for w in rp.workers}
    remove = {url: router.remove_script(rp, url, worker["id"]) for url, worker in listed.items() if url not in wanted}
    add = {url: router.add_script(rp, url) for url in sorted(wanted - set(listed))}
    return remove, add


@deploy("modelfleet router")
def run(ctx: HostRun):
    plan = ctx.plan
    doors = replica_door.doors(plan)
    if not plan.routers and not doors:
        return
    deployed = ctx.deployed()
    at = deployed["paths"].get
    if refused_when_kept(plan.unit_dropins == "keep", {u: deployed["units"].get(u) or {} for u in wants(plan, {})[
            "units"]}, name="Front door units: files modelfleet did not write"):
        return
    os_info = ctx.probe.get("os")
    wanted = wanted_packages(plan, os_info)
    osfam.family(os_info).packages(name=f"Packages for the front door ({', '.join(wanted)})", wanted=wanted,
                                   current=deployed["packages"])
    directory(name=f"Config directory {plan.config_dir} (0700)", path=plan.config_dir, current=at(plan.config_dir),
              mode="0700")
    # Before any front door's operations: a router registers its replicas through their proxies.
    for svc in doors:
        _replica_door(svc, deployed)
    if not plan.routers:
        return
    users = deployed["users"]
    users_present(name=f"Users of the front door ({', '.join(router.USERS)})", users=list(router.USERS),
                  missing=[u for u in router.USERS if users.get(u) is None])
    directory(name=f"Tools directory {TOOLS_BIN}", path=TOOLS_BIN, current=at(TOOLS_BIN))
    launcher = router.launcher()
    launcher_changed = content_changes(at(router.LAUNCHER), launcher, "0755")
    content_file(name=f"Router launcher {router.LAUNCHER}", dest=router.LAUNCHER, content=launcher,
                 current=at(router.LAUNCHER), mode="0755")
    for rp in plan.routers:
        _front_door(ctx, rp, deployed, launcher_changed)


def _front_door(ctx: HostRun, rp: RouterPlan, deployed: dict, launcher_changed: bool) -> None:
    at, p, spec = deployed["paths"].get, router.paths(rp), router.spec(rp)
    key = router.api_key(rp)
    if not key:
        fail_host(name=f"Front door {rp.name}", reasons=[f"router {rp.name}: api_key_env {rp.api_key_env} is not "
                                                         "set on the control node: no front door without a key"])
        return
    lock = router.lock(spec)
    # Built from this lock (the marker is its copy): a venv of an older lock is built again.
    installed = (at(p["installed"]) or {}).get("sha256") == hashlib.sha256(lock.encode()).hexdigest()
    content_file(name=f"Wheels and hashes of {spec.package} {spec.version} ({p['lock']})", dest=p["lock"],
                 content=lock, current=at(p["lock"]))
    venv_installed(name=f"{spec.package} {spec.version} in {router.venv(rp)} (hashes required)",
                   venv=router.venv(rp), requirement=f"{spec.package}=={spec.version}",
                   command=router.install_command(rp, ctx.plan.router_pip_index_url), present=installed)
    # The worker API's key is made on the router host once; a router running without it is restarted.
    admin_new = router.has_admin_key(rp) and not (at(p["admin"]) and at(p["admin_auth"]))
    if admin_new:
        admin_key_made(name=f"Worker API key of router {rp.name} ({p['admin']}, 0600, made on the host)",
                       script=router.admin_key_script(rp))
    files = [(p["config"], router.launcher_config(rp), "0644", False),
             *((path, content, "0600", True) for path, content in router.key_files(rp, key).items()),
             *([(p["rule"], router.render_rule(rp), "0600", False)] if router.firewalled(rp) else []),
             (p["unit"], router.render_unit(rp), "0644", False)]
    changed = {path: content_changes(at(path), content, mode) for path, content, mode, _ in files}
    extra = unmasked(rp.unit_name, deployed["units"].get(rp.unit_name) or {})
    for path, content, mode, secret in files:
        content_file(name=f"File {path} ({mode})", dest=path, content=content, current=at(path), mode=mode,
                     secret=secret)
    # Where a (re)started router begins; the running one learns of changes through its worker API instead.
    content_file(name=f"Replicas of {rp.name} ({p['workers']})", dest=p["workers"], content=router.workers_file(rp),
                 current=at(p["workers"]))
    unit = deployed["units"].get(rp.unit_name) or {}
    starting = owned_running(rp.unit_name, unit, extra, reload=changed[p["unit"]],
                             restart=any(changed.values()) or launcher_changed or not installed or admin_new)
    if starting:
        router_answers(name=f"Wait until router {rp.name} answers", script=router.health_script(rp))
    if router.behind_proxy(rp):
        _proxy(rp, deployed)
    changes = starting
    # A router (re)started here begins with the URL file: nothing to register. A PD front door's servers are
    # its flags (a change rewrote its config and restarted it): its worker API is left alone.
    if not starting and not rp.pd:
        listed = host.get_fact(router.RouterWorkers, rp=rp)
        if listed is None:
            fail_host(name=f"Router {rp.name}", reasons=[f"router {rp.name}: {rp.unit_name} is active but its "
                                                         f"worker API at {router.local_url(rp)} does not answer"])
            return
        remove, add = registration(rp, listed)
        workers_registered(name=f"Replicas of front door {rp.name}", front_door=rp.name, remove=remove, add=add)
        changes = bool(remove or add)
    guard = router.worker_guard_script(rp)
    if guard:
        router_port_guarded(name=f"The router of {rp.name} refuses every local user but the door's and its own, "
                            f"on 127.0.0.1:{rp.backend_port}", script=guard)
    probe = router.replica_exposure_script(rp)
    if probe:
        replicas_refuse_keyless(name=f"Replicas of front door {rp.name} refuse a request without the key, asked "
                                f"from {rp.host}", script=probe)
    replicas_ready(name=f"Every replica of front door {rp.name} is ready (asked from {rp.host})",
                   script=router.replicas_ready_script(rp))
    plan = ctx.plan
    tunnel = (rp.bind_address, rp.port) if _is_loopback(rp.bind_address) and plan.address not in (
        rp.bind_address, "@local") else None
    endpoint_verified(name=f"Verify {rp.served_name} through the front door {rp.base_url}",
                      ep=front_door_endpoint(rp, router.client_keys(rp)[0]), tunnel=tunnel,
                      full=ctx.alone or plan.verify_full or changes)


@operation(is_idempotent=False)
def router_port_guarded(script: str):
    """The verify gate's look at the router's own port (router.worker_guard_script), while executing: a process
    of user nobody must be refused; any answer fails the front door."""
    if not state.is_executing:
        host.noop("the router's port is asked as nobody once the router runs")
        return
    ok, output = host.run_shell_command(StringCommand(script), print_output=False, print_input=False)
    if ok:
        host.noop("a process of user nobody was refused by the router's port")
        return
    reasons = [f"verify: {line.removeprefix('modelfleet: ')}" for line in output.stderr_lines]
    yield FunctionCommand(refuse, (reasons or ["verify: the router's port check failed"],), {})


@operation(is_idempotent=False)
def replicas_refuse_keyless(script: str):
    """The verify gate's probe of the replicas from the router host (router.replica_exposure_script), while
    executing (after the replicas started): a pass changes nothing; an answer other than 401/403 on a route that
    runs the model fails the front door, naming the replica's host and route."""
    if not state.is_executing:
        host.noop("the replicas are asked without the key after they start")
        return
    ok, output = host.run_shell_command(StringCommand(script), print_output=False, print_input=False)
    if ok:
        host.noop(f"every replica refused {len(output.stdout_lines)} key-less requests from the router host")
        return
    yield FunctionCommand(refuse, ([f"verify: {line.removeprefix('modelfleet: ')}"
                                    for line in output.stderr_lines] or ["verify: the replicas' probe failed"],), {})


@operation(is_idempotent=False)
def replicas_ready(script: str):
    """The verify gate waits for every replica the front door routes to (router.replicas_ready_script), while
    executing: a router answers its /health before its workers do; replicas still not ready then report the
    door degraded, naming them."""
    if not state.is_executing:
        host.noop("the replicas are asked for their health once they run")
        return
    ok, output = host.run_shell_command(StringCommand(script), print_output=False, print_input=False)
    if ok:
        host.noop(f"{len(output.stdout_lines)} replica(s) ready")
        return
    yield FunctionCommand(refuse, ([f"verify: {line.removeprefix('modelfleet: ')}"
                                    for line in output.stderr_lines] or ["verify: the replicas' health check failed"],),
                          {})


@operation(is_idempotent=False)
def endpoint_verified(ep: Endpoint, tunnel: tuple[str, int] | None, full: bool, ready_timeout_s: float = 120):
    """The verify gate through the front door, while executing (after the router took its replicas): readiness,
    and when `full` the smoke and tool-call probe; every inference route asked without the key."""
    if not state.is_executing:
        host.noop(f"{ep.name} is verified after its replicas are in")
        return
    with through_host(host, *tunnel) if tunnel else nullcontext() as port:
        scheme = ep.base_url.split("://", 1)[0]
        target = replace(ep, base_url=f"{scheme}://127.0.0.1:{port}") if tunnel else ep
        report = {**run_gate(target, ready_timeout_s, full, None, reports_dir("bench")), "endpoint": ep.name,
                  "base_url": ep.openai_base_url, "via_ssh_tunnel": bool(tunnel)}
        if "exposure" not in report and report["readiness"].get("ok"):
            report["exposure"] = exposure.check(target)
            report["ok"] = report["ok"] and report["exposure"]["ok"]
    save_report("verify", ep.name.replace("/", "-"), report)
    if report["ok"]:
        host.noop(f"{ep.name}: " + ("ready, smoke and tool-call probe pass" if full else "ready"))
        return
    failures = [f"{part}: " + "; ".join(report[part].get("failures") or [report[part].get("error") or "failed"])
                for part in ("readiness", "smoke", "tool_probe") if part in report and not report[part].get("ok")]
    failures += [f"exposure: {f}" for f in exposure.failures_at(report.get("exposure") or {},
                                                                urlsplit(ep.base_url).netloc)]
    yield FunctionCommand(refuse, ([f"verify {ep.name}: {f}" for f in failures],), {})



def front_door_endpoint(rp: RouterPlan, key: str) -> Endpoint:
    """The verify gate's view of the front door: the model through the router, and every inference route of
    the router asked without the key."""
    return Endpoint(name=f"{rp.host}/router-{rp.name}", base_url=rp.dial_url, model=rp.served_name,
                    engine=rp.engine_name, api_key=key, refused_routes=tuple(router.spec(rp).inference_routes),
                    ca_file=rp.tls_cert, server_name=rp.client_name if rp.tls else None)


def _replica_door(svc, deployed: dict) -> None:
    """The keyed proxy before a routed replica on its host (modelfleet.plan.replica_door), with the model's key."""
    key = render.api_key(svc)
    unit_name = replica_door.unit_name(svc)
    if not key:
        fail_host(name=f"Keyed proxy of replica {svc.pool}", reasons=[
            f"pool {svc.pool}: api_key_env {svc.api_key_env} is not set on the control node: no keyed proxy"])
        return
    at, p = deployed["paths"].get, replica_door.paths(svc)
    files = replica_door.files(svc, key)
    changed = {path: content_changes(at(path), content, mode) for path, content, mode, _ in files}
    unit = deployed["units"].get(unit_name) or {}
    extra = unmasked(unit_name, unit)
    for path, content, mode, secret in files:
        content_file(name=f"File {path} ({mode})", dest=path, content=content, current=at(path), mode=mode,
                     secret=secret)
    owned_running(unit_name, unit, extra, reload=changed[p["unit"]], restart=changed[p["unit"]])
    proxy_reloaded(name=f"Reload {unit_name}", unit=unit_name,
                   reload=unit.get("ActiveState") == "active" and not changed[p["unit"]]
                   and (changed[p["conf"]] or changed[p["key"]]))


def _proxy(rp: RouterPlan, deployed: dict) -> None:
    at, p = deployed["paths"].get, router.paths(rp)
    files = [(p["proxy_key"], router.proxy_key_file(rp), "0600", True),
             *((path, content, "0600", True) for path, content in router.tls_files(rp).items()),
             (p["proxy"], router.render_proxy(rp), "0644", False),
             (p["proxy_unit"], router.render_proxy_unit(rp), "0644", False)]
    changed = {path: content_changes(at(path), content, mode) for path, content, mode, _ in files}
    unit = deployed["units"].get(rp.proxy_unit_name) or {}
    extra = unmasked(rp.proxy_unit_name, unit)
    for path, content, mode, secret in files:
        content_file(name=f"File {path} ({mode})", dest=path, content=content, current=at(path), mode=mode,
                     secret=secret)
    owned_running(rp.proxy_unit_name, unit, extra, reload=changed[p["proxy_unit"]], restart=changed[p["proxy_unit"]])
    proxy_reloaded(name=f"Reload {rp.proxy_unit_name}", unit=rp.proxy_unit_name,
                   reload=unit.get("ActiveState") == "active" and not changed[p["proxy_unit"]]
                   and any(changed[path] for path in changed if path != p["proxy_unit"]))
