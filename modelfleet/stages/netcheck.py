"""Stage netcheck: the NCCL/RCCL/Gloo gate before a pool's engines start.

files/nccl_check.py runs inside the pool's exact serving image on every host of the pool at once (one pyinfra
operation: pyinfra runs it on all hosts concurrently), one process per local GPU, ranks from the pool's host
order, rendezvous at the first host. The next operation compares every host's JSON with the threshold (the
pool's `netcheck_min_busbw_gbps`, else the hardware catalog's) and fails every host of the pool if any host
failed, so `service` starts nothing there. Pool report: reports/netcheck/<pool>.json.

It runs when a unit of the pool is about to (re)start, or always when run on its own (deploys/netcheck.py).
With `admission_h2d`, the same run also measures each GPU's pinned host <-> device copy bandwidth (one GPU at
a time) against the hardware catalog's h2d_min_gbps, on pools of one GPU too (then that is all it measures).
"""

from __future__ import annotations

import json
import os
import shlex
import zlib

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, StringCommand, deploy, operation

from modelfleet import FILES_DIR
from modelfleet.context import HostRun
from modelfleet.inventory import HostPlan, ServicePlan
from modelfleet.operations.files import content_file, directory
from modelfleet.operations.report import save_report
from modelfleet.pins import pinned_image
from modelfleet.render import gpu_flags
from modelfleet.stages import TOOLS_BIN

SCRIPT = f"{TOOLS_BIN}/nccl_check.py"
# Largest message of the sweep: nccl-tests' health checks read busbw at the top of -b 1M -e 16G on GPUs;
# the lab's Gloo over loopback stops at 64M to stay quick on two cores.
MAX_BYTES = {"nccl": "16G", "gloo": "64M"}
H2D_BYTES = "1G"  # one copy per timing: 1 GiB takes ~20 ms at PCIe Gen5 x16, well above launch noise


def wants(plan: HostPlan, probe: dict) -> dict:
    return {"paths": [TOOLS_BIN, SCRIPT]}


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
    b = backend(svc)
    ops = "all_reduce,all_gather" + (",all_to_all" if svc.recipe.layout.ep else "") if collective(svc) else ""
    argv = ["docker", "run", "--rm", "-i", "--network", "host", "--ipc=host", *gpu_flags(svc)]
    for key, value in sorted(svc.env.items()):
        if key.startswith(("NCCL_", "GLOO_")):
            argv += ["-e", f"{key}={value}"]
    argv += ["--entrypoint", "sh", image, "-c", 'cat > /tmp/nccl_check.py && exec python3 /tmp/nccl_check.py "$@"',
             "nccl_check", "--nnodes", str(svc.nnodes), "--node-rank", str(svc.node_rank), "--master-addr",
             svc.head_address, "--master-port", str(_port(svc.pool)), "--backend", b,
             "--local-procs", str(svc.gpus if b == "nccl" else 1),
             "--ops", ops, "--min-bytes", "1M", "--max-bytes", MAX_BYTES[b], "--timeout", str(svc.netcheck_timeout_s),
             *(["--h2d-bytes", H2D_BYTES] if h2d else [])]
    return " ".join(shlex.quote(a) for a in argv) + f" < {shlex.quote(SCRIPT)}"


def _run_check(state, host, results: dict, command: str) -> bool:
    """FunctionCommand body: run the check on the host, keep its JSON for the gate operation."""
    ok, output = host.run_shell_command(StringCommand(command), print_output=False, print_input=False)
    report = None
    for line in output.stdout_lines:
        if line.startswith("{"):
            try:
                report = json.loads(line)
            except ValueError:
                pass
    if report is None:
        report = {"ok": False, "error": "no report: " + " | ".join(output.stderr_lines[-5:])[:600]}
    report["exit_ok"] = ok
    results[host.name] = report
    return True  # judged by the gate operation, over every host of the pool


@operation(is_idempotent=False)
def collective_check(pool: str, command: str, needed: bool, results: dict):
    if not needed:
        host.noop(f"pool {pool}: no unit (re)starts, the gate is not needed")
        return
    yield FunctionCommand(_run_check, (results, command), {})


def threshold(svc: ServicePlan) -> float | None:
    if svc.netcheck_min_busbw_gbps is not None:
        return svc.netcheck_min_busbw_gbps
    return svc.hardware.allreduce_busbw_gbps if svc.nnodes == 1 else None


def judge(pool: str, members: list[str], reports: dict, minimum: float | None,
          h2d_asked: tuple[str, ...] = (), h2d_minimum: float | None = None) -> dict:
    """The pool's verdict from every host's report (pure): all_reduce busbw at the largest size against
    `minimum`, and for the hosts in `h2d_asked`, each GPU's copy bandwidth both ways against `h2d_minimum`."""
    problems, per_host = [], {}
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
    return {"pool": pool, "hosts": members, "ok": not problems, "threshold_gbps": minimum,
            "threshold_note": None if minimum is not None else "no threshold known: correctness only",
            "h2d_threshold_gbps": h2d_minimum if h2d_asked else None, "problems": problems, "per_host": per_host}


def _gate(state, host, pool: str, members: list[str], minimum: float | None, results: dict,
          h2d_asked: tuple[str, ...], h2d_minimum: float | None) -> bool:
    verdict = judge(pool, members, results, minimum, h2d_asked, h2d_minimum)
    if host.name == members[0]:
        save_report("netcheck", pool, verdict)
    for problem in verdict["problems"]:
        host.log_styled(f"netcheck {pool}: {problem}", fg="red", log_func=logger.error)
    return verdict["ok"]


@operation(is_idempotent=False)
def gate_passed(pool: str, members: list[str], minimum: float | None, needed: bool, results: dict,
                h2d_asked: tuple[str, ...] = (), h2d_minimum: float | None = None):
    if not needed:
        host.noop(f"pool {pool}: gate not needed")
        return
    yield FunctionCommand(_gate, (pool, members, minimum, results, h2d_asked, h2d_minimum), {})


def _needed(ctx: HostRun, svc: ServicePlan) -> bool:
    if not collective(svc) and not ctx.plan.admission_h2d:
        return False  # one GPU and no copy check: nothing to measure
    if ctx.alone or os.environ.get("MODELFLEET_NETCHECK") == "always":
        return True
    return ctx.pool_starts(svc.pool)


@deploy("modelfleet netcheck")
def run(ctx: HostRun):
    plan = ctx.plan
    mine = ctx.deployed()
    directory(name=f"Tools directory {TOOLS_BIN}", path=TOOLS_BIN, current=mine["paths"].get(TOOLS_BIN))
    content_file(name=f"Check script {SCRIPT}", dest=SCRIPT, content=(FILES_DIR / "nccl_check.py")
                 .read_text(), current=mine["paths"].get(SCRIPT), mode="0755")
    for svc in plan.services:
        needed = _needed(ctx, svc)
        pool = ctx.inventory.pools[svc.pool]
        collective_check(name=f"Collective check for pool {svc.pool} ({backend(svc)})", pool=svc.pool,
                         command=check_command(svc, pinned_image(svc), h2d=plan.admission_h2d), needed=needed,
                         results=ctx.pool_checks(svc.pool))
        gate_passed(name=f"Gate for pool {svc.pool}", pool=svc.pool, members=list(pool.hosts),
                    minimum=threshold(svc), needed=needed, results=ctx.pool_checks(svc.pool),
                    h2d_asked=tuple(n for n in pool.hosts if ctx.inventory.hosts[n].admission_h2d),
                    h2d_minimum=svc.hardware.h2d_min_gbps)
