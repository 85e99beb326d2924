"""Stage netcheck: the NCCL/RCCL/Gloo gate before a pool's engines start.

files/nccl_check.py runs inside the pool's exact serving image on every host of the pool at once (one pyinfra
operation: pyinfra runs it on all hosts concurrently), one process per local GPU, ranks from the pool's host
order, rendezvous at the first host. The next operation compares every host's JSON with the threshold (the
pool's `netcheck_min_busbw_gbps`, else the hardware catalog's) and fails every host of the pool if any host
failed, so `service` starts nothing there. Pool report: reports/netcheck/<pool>.json.

It runs when a unit of the pool is about to (re)start, or always when run on its own (deploys/netcheck.py).
With `admission_h2d`, the same run also measures each GPU's pinned host <-> device copy bandwidth (one GPU at
a time) against the hardware catalog's h2d_min_gbps, on pools of one GPU too (then that is all it measures).

Pools across hosts get their fabric (modelfleet.host.fabric: devices, IPC_LOCK and memlock, the derived environment,
the head's fabric address) exactly as their engines do, and a gate that cannot be fooled: first every member
reaches the head's rendezvous port over the derived interface within REACH_TIMEOUT_S (the failing pair named);
then the collectives with NCCL's INFO log, parsed (modelfleet.base.nccl_log) for the transport really used: a pool
whose hosts have active HCAs but whose NCCL chose sockets, or other HCAs than derived, is refused, as is an
NVLink-domain pool whose GPUs report different MNNVL fabrics. Hosts with HCAs also measure an HCA loopback
all_reduce of their own; a member under the catalog's figure (catalog/fabric.yaml) or far under the pool's
median fails, named with its HCAs.
"""

from __future__ import annotations

import functools
import json
import shlex
import statistics
import zlib

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, StringCommand, deploy, operation

from modelfleet import FILES_DIR
from modelfleet.base import nccl_log
from modelfleet.base.host_commands import TOOLS_BIN
from modelfleet.host.fabric_run import pool_fabric, refusals
from modelfleet.host.operations.files import content_file, directory
from modelfleet.host.operations.report import fail_host, save_report
from modelfleet.host.units import start_reads
from modelfleet.plan.catalog import CATALOG_DIR, read_yaml
from modelfleet.plan.inventory.plan import HostFabric, HostPlan, ServicePlan
from modelfleet.plan.pins import pinned_image
from modelfleet.plan.render import CONTAINER_UIDS_FIXED, fabric_env, fabric_flags, gpu_flags, rendezvous_address
from modelfleet.run.context import HostRun

NAME = "netcheck"
PINS: frozenset[str] = frozenset({"images", "revisions"})

SCRIPT = f"{TOOLS_BIN}/nccl_check.py"
# Largest message of the sweep: nccl-tests' health checks read busbw at the top of -b 1M -e 16G on GPUs.
# Gloo (containers without a GPU) moves every byte through CPU memory: its sweep stops at 64M so the gate
# stays short on hosts with few cores.
MAX_BYTES = {"nccl": "16G", "gloo": "64M"}
H2D_BYTES = "1G"  # one copy per timing: 1 GiB takes ~20 ms at PCIe Gen5 x16, well above launch noise
# Every member must reach the head's rendezvous port within this: containers of a pool start within seconds of
# each other (one pyinfra operation on all hosts at once), NCCL's own rendezvous would wait minutes.
REACH_TIMEOUT_S = 30
# NCCL's INFO lines the transport is read from (initialisation and the network layer only: a few per rank).
NCCL_LOG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
FABRIC_CATALOG = CATALOG_DIR / "fabric.yaml"


def wants(plan: HostPlan, probe: dict) -> dict:
    """Its script, and what deciding whether a pool (re)starts reads (the gate runs only then)."""
    unit_reads = start_reads(plan)
    return {"paths": [TOOLS_BIN, SCRIPT, *unit_reads["paths"]], "units": unit_reads["units"]}


def backend(svc: ServicePlan) -> str:
    """NCCL on GPUs (RCCL answers to the same name on ROCm), Gloo where the containers get no GPU."""
    return "nccl" if svc.gpu_passthrough and svc.hardware.vendor != "none" else "gloo"


def _port(pool: str) -> int:
    return 29400 + zlib.crc32(pool.encode()) % 500


def collective(svc: ServicePlan) -> bool:
    """Has the pool more than one GPU in all, so something to talk to?"""
    return svc.nnodes * svc.gpus >= 2


def check_command(svc: ServicePlan, image: str, h2d: bool = False) -> str:
    """The docker run that executes the check script (fed on stdin) inside the serving image."""
    b, fabric = backend(svc), svc.fabric
    ops = "all_reduce,all_gather" + (",all_to_all" if svc.recipe.layout.ep else "") if collective(svc) else ""
    # On the host's network beside a front door whose worker-API rule knows users by uid: no uid changes inside.
    argv = ["docker", "run", "--rm", "-i", "--network", "host", "--ipc=host", *CONTAINER_UIDS_FIXED, *gpu_flags(svc),
            *fabric_flags(fabric)]
    env = {**fabric_env(svc), **(NCCL_LOG_ENV if svc.nnodes > 1 and b == "nccl" else {})}
    for key, value in sorted(env.items()):
        argv += ["-e", f"{key}={value}"]
    argv += ["--entrypoint", "sh", image, "-c", 'cat > /tmp/nccl_check.py && exec python3 /tmp/nccl_check.py "$@"',
             "nccl_check", "--nnodes", str(svc.nnodes), "--node-rank", str(svc.node_rank), "--master-addr",
             rendezvous_address(svc), "--master-port", str(_port(svc.pool)), "--backend", b,
             "--local-procs", str(svc.gpus if b == "nccl" else 1),
             "--ops", ops, "--min-bytes", "1M", "--max-bytes", MAX_BYTES[b], "--timeout", str(svc.netcheck_timeout_s),
             *(["--h2d-bytes", H2D_BYTES] if h2d else [])]
    if svc.nnodes > 1:
        ifname = reach_interface(svc)
        argv += ["--reach-timeout", str(REACH_TIMEOUT_S), *(["--ifname", ifname] if ifname else [])]
    if fabric and fabric.rdma and b == "nccl" and svc.gpus >= 2:
        argv += ["--hca-loopback"]
    return " ".join(shlex.quote(a) for a in argv) + f" < {shlex.quote(SCRIPT)}"


def reach_interface(svc: ServicePlan) -> str | None:
    """The interface members reach the head from: the fabric's, else the one the inventory gave Gloo (one name:
    NCCL's setting is a prefix list)."""
    if svc.fabric:
        return svc.fabric.ifname
    gloo = svc.env.get("GLOO_SOCKET_IFNAME", "")
    return gloo if gloo and "," not in gloo else None


def _run_check(state, host, results: dict, command: str) -> bool:
    """FunctionCommand body: run the check on the host, keep its JSON for the gate operation."""
    ok, output = host.run_shell_command(StringCommand(command), print_output=False, print_input=False)
    results[host.name] = host_report(ok, output.stdout_lines, output.stderr_lines)
    return True  # judged by the gate operation, over every host of the pool


def host_report(ok: bool, stdout: list[str], stderr: list[str]) -> dict:
    """One host's report from the check's output: its JSON line (and the HCA loopback's), and the transport
    NCCL's INFO lines say it used."""
    report, loopback = None, None
    for line in stdout:
        if line.startswith("{"):
            try:
                found = json.loads(line)
            except ValueError:
                continue
            if "hca_loopback" in found:
                loopback = found["hca_loopback"]
            else:
                report = found
    if report is None:
        report = {"ok": False, "error": "no report: " + " | ".join(stderr[-5:])[:600]}
    report["exit_ok"] = ok
    if any("NCCL INFO" in line or line.startswith("NCCL version") for line in stdout):
        report["transport"] = nccl_log.parse(stdout)
    if loopback is not None:
        loopback["transport"] = nccl_log.parse(loopback.pop("net_lines", []))
        report["hca_loopback"] = loopback
    return report


@operation(is_idempotent=False)
def collective_check(pool: str, command: str, needed: bool, results: dict):
    if not needed:
        host.noop(f"pool {pool}: no unit (re)starts, the gate is not needed")
        return
    yield FunctionCommand(_run_check, (results, command), {})


@functools.cache
def fabric_catalog() -> dict:
    """catalog/fabric.yaml: the median rule and each board's sourced figures."""
    data = read_yaml(FABRIC_CATALOG.read_text())
    for board, figures in data["boards"].items():
        for name in ("hca_loopback", "multinode"):
            if f"{name}_hcas" in figures and not figures.get(f"{name}_source"):
                raise ValueError(f"{FABRIC_CATALOG}: boards.{board}.{name}_source: every figure names its source")
    return data


def _figure(svc: ServicePlan, name: str) -> float | None:
    """A board's figure from the fabric catalog, when this member's fabric has the HCAs it was measured with."""
    figures = fabric_catalog()["boards"].get(svc.hardware.id) or {}
    if svc.fabric is None or f"{name}_hcas" not in figures or len(svc.fabric.hcas) != figures[f"{name}_hcas"]:
        return None
    return figures.get(f"{name}_allreduce_busbw_gbps" if name == "multinode" else f"{name}_busbw_gbps")


def threshold(svc: ServicePlan) -> float | None:
    if svc.netcheck_min_busbw_gbps is not None:
        return svc.netcheck_min_busbw_gbps
    return svc.hardware.allreduce_busbw_gbps if svc.nnodes == 1 else _figure(svc, "multinode")


def loopback_threshold(svc: ServicePlan) -> float | None:
    return _figure(svc, "hca_loopback")


def _where(fabric: HostFabric) -> str:
    """A member's fabric in one phrase, for the line that fails it."""
    hcas = f"HCAs {','.join(fabric.hcas)}" if fabric.hcas else "no HCA"
    return f"{hcas} (interface {fabric.ifname or 'not derived'})"


def transport_problems(name: str, transport: dict | None, fabric: HostFabric) -> list[str]:
    """What NCCL really used on a member, against its fabric: HCAs where HCAs are active, the derived ones,
    and the derived interface where it runs over sockets."""
    if transport is None:
        return [f"{name}: NCCL printed no INFO line, so the transport it used is unknown (NCCL_DEBUG=INFO "
                f"ignored?); refused: {_where(fabric)} unproven"]
    used, sockets = nccl_log.hcas_used(transport), [s["ifname"] for s in transport["sockets"]]
    if fabric.rdma and (nccl_log.over_sockets(transport) or not used):
        return [f"{name}: NCCL used sockets ({', '.join(sockets) or 'no interface named'}) although its "
                f"{_where(fabric)} are active: the container lacks /dev/infiniband, IPC_LOCK or an unlimited "
                "memlock, or NCCL_IB_HCA matches none of them"]
    if fabric.rdma and sorted(used) != sorted(fabric.hcas):
        return [f"{name}: NCCL used HCAs {','.join(used)}, not the derived {','.join(fabric.hcas)}"]
    if not fabric.rdma and fabric.ifname and sockets and fabric.ifname not in sockets:
        return [f"{name}: NCCL's sockets went over {', '.join(sockets)}, not the derived interface {fabric.ifname}"]
    return []


def mnnvl_problems(members: list[str], reports: dict, fabrics: dict[str, HostFabric]) -> list[str]:
    """An NVLink-domain pool: every GPU of every member reports one MNNVL fabric (UUID and clique); a member
    outside it would carry the pool's traffic over the network instead."""
    domains = {}
    for name in members:
        transport = (reports.get(name) or {}).get("transport")
        if fabrics.get(name) and fabrics[name].imex and transport is not None:
            domains[name] = {(m["uuid"], m["clique"]) for m in transport["mnnvl"]}
    formed = [d for seen in domains.values() for d in seen if d[0] != "0.0"]
    common = max(set(formed), key=formed.count) if formed else None
    problems = []
    for name, seen in domains.items():
        if not {d for d in seen if d[0] != "0.0"}:
            problems.append(f"{name}: its GPUs report no MNNVL fabric (the NVLink domain is not formed: Fabric "
                            "Manager, IMEX or the switch trays)")
        elif seen != {common}:
            found = ", ".join(f"{uuid} clique {clique}" for uuid, clique in sorted(seen))
            problems.append(f"{name}: its GPUs report MNNVL fabric {found}, the pool's is {common[0]} clique "
                            f"{common[1]}: not one NVLink domain")
    return problems


def loopback_problems(members: list[str], reports: dict, fabrics: dict[str, HostFabric],
                      minimum: float | None, floor: float) -> list[str]:
    """Each member's HCA loopback busbw against the board's figure and `floor` x the pool's median."""
    figures = {name: reports[name]["hca_loopback"] for name in members
               if fabrics.get(name) and fabrics[name].rdma and (reports.get(name) or {}).get("hca_loopback")}
    problems = [f"{name}: {figure.get('error')} ({_where(fabrics[name])})"
                for name, figure in figures.items() if not figure.get("ok")]
    measured = {name: f["busbw_gbs"] for name, f in figures.items() if f.get("ok")}
    median = statistics.median(measured.values()) if len(measured) >= 2 else None
    for name, busbw in measured.items():
        if minimum is not None and busbw < minimum:
            problems.append(f"{name}: HCA loopback all_reduce busbw {busbw} GB/s < {minimum} GB/s required "
                            f"({_where(fabrics[name])})")
        elif median is not None and busbw < floor * median:
            problems.append(f"{name}: HCA loopback all_reduce busbw {busbw} GB/s < {floor} x the pool's median "
                            f"{median} GB/s ({_where(fabrics[name])})")
    return problems


def judge(pool: str, members: list[str], reports: dict, minimum: float | None,
          h2d_asked: tuple[str, ...] = (), h2d_minimum: float | None = None,
          fabrics: dict[str, HostFabric] | None = None, loopback_minimum: float | None = None) -> dict:
    """The pool's verdict from every host's report (pure): all_reduce busbw at the largest size against
    `minimum`, and for the hosts in `h2d_asked`, each GPU's copy bandwidth both ways against `h2d_minimum`.
    With the pool's `fabrics` (a pool across hosts on NCCL): the transport each member used, the MNNVL domain,
    and the HCA loopback figures (against `loopback_minimum` and the pool-median rule)."""
    problems, per_host, fabrics = [], {}, fabrics or {}
    for name in members:
        report = reports.get(name)
        if not report:
            problems.append(f"{name}: no result (the check did not run there)")
            continue
        if not report.get("ok") or not report.get("exit_ok"):
            problems.append(f"{name}: {report.get('error') or 'check failed'}")
            continue
        results = report["results"]
        per_host[name] = {"nccl_version": report.get("nccl_version"), "world_size": report.get("world_size")}
        if report.get("reach_s") is not None:
            per_host[name]["reach_s"] = report["reach_s"]
        if name in fabrics:
            transport = report.get("transport")
            per_host[name].update(fabric=_where(fabrics[name]), container_env=report.get("interface"),
                                  transport=transport, hca_loopback=report.get("hca_loopback"))
            if report.get("backend", "nccl") == "nccl":
                problems += transport_problems(name, transport, fabrics[name])
        reduces = [r for r in results if r["op"] == "all_reduce"]
        if reduces:
            largest = max(reduces, key=lambda r: r["bytes"])
            per_host[name].update(busbw_gbps_at_largest=largest["busbw_gbs"], bytes=largest["bytes"], curve=[
                {k: r[k] for k in ("op", "bytes", "time_us", "algbw_gbs", "busbw_gbs")} for r in results])
            if minimum is not None and largest["busbw_gbs"] < minimum:
                problems.append(f"{name}: all_reduce busbw {largest['busbw_gbs']} GB/s at {largest['bytes']} B "
                                f"< {minimum} GB/s required")
        if name in h2d_asked:
            copies = report.get("h2d")
            if not copies:
                problems.append(f"{name}: no host-to-device figures (the check script did not measure them)")
                continue
            per_host[name]["h2d"] = copies
            for gpu in copies if h2d_minimum is not None else []:
                if min(gpu["h2d_gbs"], gpu["d2h_gbs"]) < h2d_minimum:
                    problems.append(f"{name}: GPU {gpu['gpu']} copies host-to-device at {gpu['h2d_gbs']} GB/s and "
                                    f"device-to-host at {gpu['d2h_gbs']} GB/s, < {h2d_minimum} GB/s required")
    if fabrics:
        floor = fabric_catalog()["median_floor"]
        problems += mnnvl_problems(members, reports, fabrics)
        problems += loopback_problems(members, reports, fabrics, loopback_minimum, floor)
    return {"pool": pool, "hosts": members, "ok": not problems, "threshold_gbps": minimum,
            "threshold_note": None if minimum is not None else "no threshold known: correctness only",
            "h2d_threshold_gbps": h2d_minimum if h2d_asked else None, "problems": problems, "per_host": per_host}


def _gate(state, host, pool: str, members: list[str], minimum: float | None, results: dict,
          h2d_asked: tuple[str, ...], h2d_minimum: float | None, fabrics: dict | None,
          loopback_minimum: float | None) -> bool:
    verdict = judge(pool, members, results, minimum, h2d_asked, h2d_minimum, fabrics, loopback_minimum)
    if host.name == members[0]:
        save_report("netcheck", pool, verdict)
    for problem in verdict["problems"]:
        host.log_styled(f"netcheck {pool}: {problem}", fg="red", log_func=logger.error)
    return verdict["ok"]


@operation(is_idempotent=False)
def gate_passed(pool: str, members: list[str], minimum: float | None, needed: bool, results: dict,
                h2d_asked: tuple[str, ...] = (), h2d_minimum: float | None = None, fabrics: dict | None = None,
                loopback_minimum: float | None = None):
    if not needed:
        host.noop(f"pool {pool}: gate not needed")
        return
    yield FunctionCommand(_gate, (pool, members, minimum, results, h2d_asked, h2d_minimum, fabrics,
                                  loopback_minimum), {})


def _needed(ctx: HostRun, svc: ServicePlan) -> bool:
    if not collective(svc) and not ctx.plan.admission_h2d:
        return False  # one GPU and no copy check: nothing to measure
    if ctx.alone:  # `pyinfra INVENTORY deploys/netcheck.py`: the gate on demand, whether or not a unit restarts
        return True
    return ctx.pool_starts(svc.pool)


@deploy("modelfleet netcheck")
def run(ctx: HostRun):
    plan = ctx.plan
    if not plan.services:  # a router-only host (modelfleet.plan.inventory.router_only): nothing to fetch or check
        return
    mine = ctx.deployed()
    directory(name=f"Tools directory {TOOLS_BIN}", path=TOOLS_BIN, current=mine["paths"].get(TOOLS_BIN))
    content_file(name=f"Check script {SCRIPT}", dest=SCRIPT, content=(FILES_DIR / "nccl_check.py")
                 .read_text(), current=mine["paths"].get(SCRIPT), mode="0755")
    refused = refusals(ctx, plan.services)
    if refused:  # before any container of the pool runs
        for svc in plan.services:
            members, mine = list(ctx.inventory.pools[svc.pool].hosts), [
                line for line in refused if line.startswith(f"pool {svc.pool}: ")]
            if mine and plan.name == members[0]:
                save_report("netcheck", svc.pool, {"pool": svc.pool, "hosts": members, "ok": False,
                                                   "stage": "fabric", "problems": mine})
        fail_host(name="Pool fabric", reasons=refused)
        return False
    for svc in plan.services:
        needed, svc = _needed(ctx, svc), ctx.as_run(svc)
        pool, fabric = ctx.inventory.pools[svc.pool], pool_fabric(ctx, svc.pool)
        collective_check(name=f"Collective check for pool {svc.pool} ({backend(svc)})", pool=svc.pool,
                         command=check_command(svc, pinned_image(svc), h2d=plan.admission_h2d), needed=needed,
                         results=ctx.pool_checks(svc.pool))
        gate_passed(name=f"Gate for pool {svc.pool}", pool=svc.pool, members=list(pool.hosts),
                    minimum=threshold(svc), needed=needed, results=ctx.pool_checks(svc.pool),
                    h2d_asked=tuple(n for n in pool.hosts if ctx.inventory.hosts[n].admission_h2d),
                    h2d_minimum=svc.hardware.h2d_min_gbps, fabrics=dict(fabric.hosts) if fabric else None,
                    loopback_minimum=loopback_threshold(svc))
