"""Day-two reads over SSH with fabric: fleet status, engine logs, and a tunnel to a loopback-bound endpoint.

fabric rather than pyinfra: these are queries that return data (a table, a stream of lines, a forwarded port),
not a converge, and pyinfra would print its converge UI around them; a fabric Connection per host, run from
parallel threads, hands back each host's result (and an unreachable host as an error, not an abort).

Connections are ssh.py's: the inventory's own SSH settings, host keys checked as pyinfra checks them.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import threading

from modelfleet.base import masking
from modelfleet.base.host_commands import (
    CURRENT,
    GPU_MEMORY_STATUS,
    boot_token_sh,
    driver_version_sh,
    journal_command,
    parse_gpu_memory_status,
    revisions_dir,
    unit_show_command,
)
from modelfleet.host import host_record, ssh
from modelfleet.host.health import admission_state
from modelfleet.plan import router, venvs, weight_cache
from modelfleet.plan.inventory.plan import HostPlan, ServicePlan
from modelfleet.run.checks.tunnel import forward

MARK = "@@modelfleet-status"
UNIT_PROPERTIES = ("ActiveState", "SubState", "NRestarts", "ExecMainStartTimestamp")


def _venv_echo(svc) -> str:
    """A venv engine's `image`: the venv its running unit's ExecStart names (venv:<path>), as systemd has it."""
    unit = shlex.quote(svc.unit_name)
    return (f"echo \"image=venv:$(systemctl show -p ExecStart --value {unit} 2>/dev/null "
            f"| grep -o '{venvs.VENV_ROOT}/[^/ ]*' | head -n 1)\"; echo image_id=; ")


def status_script(plan: HostPlan) -> str:
    """One round trip per host: every unit's state, its container's image, model revision, health, GPUs."""
    parts = []
    for svc in plan.services:
        container = shlex.quote(svc.container_name)
        current = shlex.quote(f"{revisions_dir(svc.model_dir)}/{CURRENT}")
        health = shlex.quote(f"{svc.base_url}{svc.engine.health_path}") if svc.node_rank == 0 else ""
        parts.append(
            f"echo '{MARK} service {svc.pool}'; "
            f"{unit_show_command(svc.unit_name, UNIT_PROPERTIES)}; "
            + (_venv_echo(svc) if svc.venv else
               f"echo \"image=$(docker inspect --format '{{{{.Config.Image}}}}' {container} 2>/dev/null)\"; "
               f"echo \"image_id=$(docker inspect --format '{{{{.Image}}}}' {container} 2>/dev/null)\"; ")
            +
            f"echo \"revision=$(readlink {current})\"; "
            + (f"echo \"health=$(curl -s -o /dev/null -m 5 -w '%{{http_code}}' {health})\"; " if health else "")
        )
    for rp in plan.routers:  # a front door: its unit, and the replicas its router lists (and their health)
        parts.append(f"echo '{MARK} router {rp.name}'; {unit_show_command(rp.unit_name, UNIT_PROPERTIES)}; "
                     f"{router.workers_echo(rp)}; ")
    parts.append(f"echo '{MARK} host'; echo \"driver=$({driver_version_sh()})\"; echo \"boot=$({boot_token_sh()})\";")
    parts.append(f"echo '{MARK} gpus'; {GPU_MEMORY_STATUS} 2>/dev/null || true;")
    parts.append(host_record.script())  # last: parse_status reads nothing after its mark
    return " ".join(parts)


def parse_status(output: str) -> dict:
    result: dict = {"services": {}, "gpus": [], "host": {}, "routers": {}}
    section = None
    for line in output.splitlines():
        if line.startswith(host_record.MARK):
            break
        if line.startswith(MARK):
            words = line[len(MARK):].split()
            section = words[1] if words[0] == "service" else words[0]
            if words[0] == "service":
                result["services"][section] = {}
            elif words[0] == "router":
                section = ("router", words[1])
                result["routers"][words[1]] = {}
        elif isinstance(section, tuple) and "=" in line:
            key, _, value = line.partition("=")
            result["routers"][section[1]][key] = value or None
        elif section == "gpus":
            gpu = parse_gpu_memory_status(line)
            if gpu:
                result["gpus"].append(gpu)
        elif section == "host" and "=" in line:
            key, _, value = line.partition("=")
            result["host"][key] = value.strip() or None
        elif section and "=" in line:
            key, _, value = line.partition("=")
            result["services"][section][key] = value or None
    return result


def on_hosts(plans: list[HostPlan], script_of) -> dict[str, tuple[int, str, str] | Exception]:
    """`script_of(plan)` on every host at once, one round trip each (a local command for @local): (exit status,
    stdout, stderr), or the error that kept it from running (unreachable, auth refused, host key unknown or
    changed)."""
    results: dict[str, tuple[int, str, str] | Exception] = {}

    def one(plan: HostPlan) -> None:
        if plan.address == "@local":  # pyinfra's local connector: the command runs on this machine
            try:
                done = subprocess.run(["bash", "-c", script_of(plan)], capture_output=True, text=True, timeout=600)
                results[plan.name] = (done.returncode, done.stdout, done.stderr)
            except Exception as error:
                results[plan.name] = error
            return
        conn = ssh.connect(plan)
        try:
            results[plan.name] = ssh.execute(conn, plan, script_of(plan))
        except Exception as error:
            results[plan.name] = error
        finally:
            conn.close()

    threads = [threading.Thread(target=one, args=(plan,)) for plan in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _unreachable(outcome: Exception) -> str:
    return str(outcome) if isinstance(outcome, ssh.HostKeyError) else f"{type(outcome).__name__}: {outcome}"


def drain(plans: list[HostPlan]) -> dict[str, str | None]:
    """Stop the hosts' engine units, and their weight caches (the driver is replaced under them), and keep them
    from starting at boot (a driver upgrade reboots them; the service stage enables and starts them again once
    admission and the gate passed). Host -> error or None."""
    def script(plan: HostPlan) -> str:
        units = " ".join(shlex.quote(unit) for svc in plan.services for unit in weight_cache.unit_names(svc))
        # An engine stopped under `docker run` ends failed: a drained unit reads inactive, not failed.
        return f"systemctl disable --now {units} && {{ systemctl reset-failed {units} 2>/dev/null || true; }}" \
            if units else "true"

    return {name: _error(outcome) for name, outcome in on_hosts(plans, script).items()}


def undrain(plans: list[HostPlan]) -> dict[str, str | None]:
    """Enable and start what `drain` stopped: the weight caches first (the engine maps their weights), then the
    engine units. Host -> error or None."""
    def script(plan: HostPlan) -> str:
        caches = [u for svc in plan.services for u in weight_cache.unit_names(svc)[1:]]
        engines = [svc.unit_name for svc in plan.services]
        return " && ".join(f"systemctl enable --now {' '.join(map(shlex.quote, units))}"
                           for units in (caches, engines) if units) or "true"

    return {name: _error(outcome) for name, outcome in on_hosts(plans, script).items()}


def _error(outcome) -> str | None:
    if isinstance(outcome, Exception):
        return _unreachable(outcome)
    return None if outcome[0] == 0 else (outcome[2] or outcome[1]).strip()[-500:] or f"exit {outcome[0]}"


def behind_front_doors(resolved, hosts: list[str]) -> list[tuple]:
    """(front door, replica) for every replica served from `hosts` that sits behind a front door."""
    return [(rp, w) for rp in resolved.routers.values() for w in rp.workers if w.host in hosts]


def front_doors(resolved, hosts: list[str], present: bool) -> dict[str, str | None]:
    """Take the replicas served from `hosts` out of their front doors (`present` False: in-flight requests end
    on them, no new one reaches them), or put them back once they answer; two round trips per router host (its
    list, then the calls). "<front door> <url>" -> error or None."""
    pairs = behind_front_doors(resolved, hosts)
    doors = {rp.name: rp for rp, _ in pairs}
    if not doors:
        return {}
    plans = {rp.host: resolved.hosts[rp.host] for rp in doors.values()}
    listed = on_hosts(list(plans.values()), lambda plan: "; ".join(
        f"echo {shlex.quote(f'{MARK} router {rp.name}')}; {router.workers_echo(rp)}" for rp in doors.values()
        if rp.host == plan.name))
    out: dict[str, str | None] = {}
    calls: dict[str, list[str]] = {}
    for rp, worker in pairs:
        where = f"{rp.name} {worker.url}"
        outcome = listed[rp.host]
        if isinstance(outcome, Exception):
            out[where] = f"router host {rp.host}: {_unreachable(outcome)}"
            continue
        lines = outcome[1].splitlines()
        mark = f"{MARK} router {rp.name}"
        after = lines[lines.index(mark) + 1] if mark in lines[:-1] else ""
        workers = router.listed(after.removeprefix("workers=")) if after.startswith("workers=") else None
        if workers is None:
            out[where] = f"router {rp.name} on {rp.host} does not answer its worker API"
        elif present and worker.url not in workers:
            calls.setdefault(rp.host, []).append(router.add_script(rp, worker.url))
        elif not present and worker.url in workers:
            calls.setdefault(rp.host, []).append(router.remove_script(rp, worker.url, workers[worker.url]["id"]))
    done = on_hosts([plans[h] for h in calls], lambda plan: " && ".join(f"( {c} )" for c in calls[plan.name]))
    for rp, worker in pairs:
        where = f"{rp.name} {worker.url}"
        outcome = done.get(rp.host)
        if where in out or outcome is None:
            out.setdefault(where, None)
        elif isinstance(outcome, Exception):
            out[where] = f"router host {rp.host}: {_unreachable(outcome)}"
        else:
            out[where] = None if outcome[0] == 0 else (outcome[2] or outcome[1]).strip()[-500:] or f"exit {outcome[0]}"
    return out


def status(plans: list[HostPlan]) -> list[dict]:
    """Every host at once; a host that cannot be reached is reported as such, not skipped."""
    results = on_hosts(plans, status_script)
    rows = []
    for plan in plans:
        outcome = results[plan.name]
        if isinstance(outcome, Exception):
            rows.append({"host": plan.name, "reachable": False, "error": _unreachable(outcome)})
            continue
        parsed = parse_status(outcome[1])
        services = []
        for svc in plan.services:
            got = parsed["services"].get(svc.pool, {})
            services.append({"pool": svc.pool, "unit": svc.unit_name, "rank": svc.node_rank,
                             "gpu_indices": list(svc.gpu_indices),
                             "state": f"{got.get('ActiveState')}/{got.get('SubState')}",
                             "restarts": int(got["NRestarts"]) if (got.get("NRestarts") or "").isdigit() else None,
                             "started": got.get("ExecMainStartTimestamp"), "image": got.get("image"),
                             "image_id": got.get("image_id"), "revision": got.get("revision"),
                             "endpoint": svc.base_url if svc.node_rank == 0 else None,
                             "health": got.get("health")})
        rows.append({"host": plan.name, "reachable": True, "services": services, "gpus": parsed["gpus"],
                     "driver": parsed["host"].get("driver"), "boot": parsed["host"].get("boot"),
                     "admission": admission_state(plan.name), "routers": _routers(plan, parsed["routers"]),
                     "record": host_record.record(plan, outcome[1], parsed["host"].get("driver"), services,
                                                  host_record.admission_report(plan.name))})
    return _in_router(plans, rows)


def _routers(plan: HostPlan, parsed: dict) -> list[dict]:
    """The host's front doors: unit state, and {replica URL: healthy} as the router lists them (None: the router
    did not answer)."""
    out = []
    for rp in plan.routers:
        got = parsed.get(rp.name, {})
        listed = router.listed(got.get("workers") or "")
        out.append({"name": rp.name, "unit": rp.unit_name, "front_door": rp.base_url, "tls": rp.tls,
                    "state": f"{got.get('ActiveState')}/{got.get('SubState')}",
                    "workers": None if listed is None else {url: w["healthy"] for url, w in listed.items()}})
    return out


def _in_router(plans: list[HostPlan], rows: list[dict]) -> list[dict]:
    """Each routed replica's place in its front door, from what the router host's row says: `in`, `out` (the
    router does not list it), `unhealthy` (listed, but the router's health check took it out: it gets no
    requests until two checks pass), or None when not known here."""
    listed = {}
    for row in rows:
        for door in row.get("routers", []):
            listed[door["name"]] = door["workers"]
    plan_of = {plan.name: plan for plan in plans}
    for row in rows:
        for service in row.get("services", []):
            svc = next(s for s in plan_of[row["host"]].services if s.pool == service["pool"])
            workers = listed.get(router.front_door_name(svc.served_name)) if svc.router and not svc.node_rank \
                else None
            service["router"] = None if workers is None else "out" if svc.router_url not in workers else (
                "unhealthy" if workers[svc.router_url] is False else "in")
    return rows


def _admission_cell(state: dict | None) -> str:
    if state is None:
        return "-"
    if not state["ok"]:
        return "refused"
    return f"{state['age_h']}h" if state["valid"] else "expired"


def status_table(rows: list[dict]) -> str:
    lines = [f"{'HOST':<14} {'ADMITTED':<9} {'POOL':<16} {'GPUS':<8} {'STATE':<18} {'HEALTH':<6} {'ROUTER':<9} "
             f"{'RESTARTS':<8} {'REVISION':<12} IMAGE"]
    for row in rows:
        if not row["reachable"]:
            lines.append(f"{row['host']:<14} unreachable: {row['error']}")
            continue
        for s in row["services"]:
            gpus = ",".join(map(str, s["gpu_indices"])) or "-"
            lines.append(f"{row['host']:<14} {_admission_cell(row.get('admission')):<9} {s['pool']:<16} {gpus:<8} "
                         f"{s['state']:<18} {s['health'] or '-':<6} {s.get('router') or '-':<9} "
                         f"{s['restarts'] if s['restarts'] is not None else '-':<8} "
                         f"{(s['revision'] or '-')[:12]:<12} {s['image'] or '-'}")
        for door in row.get("routers", []):
            replicas = door["workers"]
            listed = "no answer" if replicas is None else \
                f"{sum(h is not False for h in replicas.values())}/{len(replicas)} replicas healthy"
            lines.append(f"{row['host']:<14} {'-':<9} {'door ' + door['name']:<16} {'-':<8} {door['state']:<18} "
                         f"{door['front_door']} ({'TLS' if door.get('tls') else 'plain HTTP'}; {listed})")
            lines += [f"{'':<14} {'':<9} {'  replica':<16} {'-':<8} {'-':<18} {url} "
                      f"({'unhealthy' if healthy is False else 'listed'})" for url, healthy in (replicas or {}).items()]
    return "\n".join(lines)


def logs(plans: list[HostPlan], lines: int = 50, follow: bool = False, sink=sys.stdout) -> None:
    """Each host's engine journal, lines prefixed `[host]`; with follow, until interrupted."""
    lock = threading.Lock()

    def stream(plan: HostPlan, command: str) -> None:
        conn = ssh.connect(plan)
        try:
            ssh.open_checked(conn, plan)
            _, stdout, _ = conn.client.exec_command(command + " 2>&1")
            for line in stdout:
                with lock:
                    sink.write(masking.mask(f"[{plan.name}] {line.rstrip()}") + "\n")
                    sink.flush()
        except Exception as error:  # one host's failure is reported, the others go on
            with lock:
                sink.write(masking.mask(f"[{plan.name}] modelfleet: {type(error).__name__}: {error}") + "\n")
        finally:
            conn.close()

    threads = [threading.Thread(target=stream,
                                args=(plan, journal_command(svc.unit_name, lines, follow=follow, iso=True)),
                                daemon=True)
               for plan in plans for svc in plan.services]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def tunnel(plan: HostPlan, svc: ServicePlan, local_port: int):
    """(open connection, context manager forwarding local_port to the endpoint): `ssh -N -L` over the
    inventory's SSH settings; the context yields the bound local port."""
    conn = ssh.connect(plan)
    ssh.open_checked(conn, plan)
    return conn, forward(conn.transport, svc.bind_address, svc.port, local_port)

