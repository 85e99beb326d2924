"""Stage verify: the acceptance gate after `service`. From the control node: readiness (standard library, in
the pyinfra process), then smoke and the tool-call + multi-turn probe through the openai SDK (a child
interpreter, checks/gate.py) of every endpoint this host heads; a failure stops the host (exit != 0).
The smoke and probe run when the pool's units (re)started in this run, when the stage runs alone
(deploys/verify.py) or with host data `verify_full`; a converge that changed nothing checks readiness only.
Loopback-bound endpoints are reached through the host's own pyinfra SSH connection (direct-tcpip).
On an endpoint with an API key, every check also asks /v1/chat/completions and the engine's non-/v1 inference
route without the key (checks/exposure.py): an answer other than 401/403 fails the host, naming the route."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace
from urllib.parse import urlsplit

from pyinfra import host, state
from pyinfra.api import FunctionCommand, deploy, operation

from modelfleet.host.operations.report import note, refuse, reports_dir, save_report
from modelfleet.host.units import start_reads
from modelfleet.plan import weight_cache
from modelfleet.run import timeline
from modelfleet.run.checks import Endpoint, endpoint, exposure, reachable_from_control_node
from modelfleet.run.checks.gate import run_gate
from modelfleet.run.checks.tunnel import through_host
from modelfleet.run.context import HostRun

NAME = "verify"
PINS: frozenset[str] = frozenset()


def wants(plan, probe: dict) -> dict:
    """What deciding whether a pool (re)starts reads (a pool that does is verified in full)."""
    return start_reads(plan)



def _failures(report: dict) -> list[str]:
    out = [f"bench: {flag}" for flag in (report.get("bench") or {}).get("regressions", [])]
    for part in ("readiness", "smoke", "tool_probe") if report.get("scope") != "readiness" else ("readiness",):
        result = report.get(part) or {}
        if not result.get("ok"):
            out.append(f"{part}: " + "; ".join(result.get("failures") or [result.get("error") or "not run"]))
    if not (report.get("exposure") or {"ok": True})["ok"]:  # named by the real address, not a tunnel's end
        out += [f"exposure: {f}" for f in exposure.failures_at(report["exposure"], urlsplit(report["base_url"]).netloc)]
    return out


BENCH = {"concurrencies": [1, 4], "num_prompts": 16, "input_len": 128, "output_len": 64}


@operation(is_idempotent=False)
def endpoint_verified(ep: Endpoint, tunnel: tuple[str, int] | None, ready_timeout_s: float, full: bool = True,
                      with_bench: bool = False, pool: str | None = None):
    """Runs the checks only while executing (after the service stage): a pass changes nothing. With
    `with_bench` (host data verify_bench), a short bench follows and a regression fails the gate."""
    if not state.is_executing:
        host.noop(f"{ep.name} is verified after the service stage")
        return
    with through_host(host, *tunnel) if tunnel else nullcontext() as port:
        target = replace(ep, base_url=f"http://127.0.0.1:{port}") if tunnel else ep
        report = {**run_gate(target, ready_timeout_s, full, BENCH if with_bench else None,
                             reports_dir("bench")),
                  "endpoint": ep.name, "base_url": ep.openai_base_url, "via_ssh_tunnel": bool(tunnel)}
        # The gate's child asks it on a full check; a readiness-only converge asks it here (standard library).
        if ep.api_key and "exposure" not in report and report["readiness"].get("ok"):
            report["exposure"] = exposure.check(target)
            report["ok"] = report["ok"] and report["exposure"]["ok"]
    save_report("verify", ep.name, report)
    if pool and report["readiness"].get("ok"):  # the pool's first answer, for its timeline
        timeline.reached_now(pool, "first_answer")
    if report["ok"]:
        host.noop(f"{ep.name}: " + ("ready, smoke and tool-call probe pass" if full else "ready (nothing changed)"))
        return
    yield FunctionCommand(refuse, ([f"verify {ep.name}: {f}" for f in _failures(report)],), {})


def weight_load_said(engine: str, lines: list[str]) -> dict:
    """What the engine's own log says of its last weight load, where it runs with the restart tier: `mapped`
    (from the weight cache), `fallback` (it asked the cache and loaded from disk, with why where it says),
    `disk` (it loaded without a word of the cache) or `unknown` (no such line), and the line that says so."""
    boot = timeline.parse_boot(engine, lines) or {"events": [], "weight_load": None}
    said = {"skipped": "mapped", "fallback": "fallback", "loaded": "disk"}.get(boot["weight_load"], "unknown")
    event = next((e for e in boot["events"] if e["event"] in ("weights_fallback", "weights_mapped")), {})
    return {"weight_load": said, **{k: v for k, v in event.items() if k in ("why", "tensors", "mode")}}


def _weight_load(state, host, svc_name: str, engine: str, container: str, cache_unit: str) -> bool:
    """FunctionCommand body: read the engine's lines, report which load happened, say a fallback in one line."""
    ok, output = host.run_shell_command(timeline.boot_log_command(container), print_output=False)
    said = weight_load_said(engine, output.stdout_lines if ok else [])
    save_report("weight_load", f"{svc_name}-{host.name}", {"host": host.name, **said})
    if said["weight_load"] == "mapped":
        host.log_styled(f"weight cache: {svc_name} mapped {said.get('tensors', '?')} tensors from the weight "
                        "cache", fg="green")
        return True
    why = {"fallback": f"fell back to loading from disk ({said.get('why') or 'the daemon was not usable'})",
           "disk": "loaded from disk without asking the weight cache",
           "unknown": "printed no weight-load line (its log is gone or unreadable)"}[said["weight_load"]]
    note(state, host, f"modelfleet: weight cache {said['weight_load']}: {svc_name} on {host.name} {why}: the "
                      f"restart tier did not serve this start (journalctl -u {cache_unit})")
    return True


@operation(is_idempotent=False)
def weight_load_reported(svc_name: str, engine: str, container: str, cache_unit: str):
    """The restart tier's verify: the engine's own lines say whether its weights were mapped from the cache or it
    fell back to the disk (which vLLM's fallback does without failing), reported either way."""
    if not state.is_executing:
        host.noop(f"{svc_name}: its weight load is read from the engine's log once it runs")
        return
    yield FunctionCommand(_weight_load, (svc_name, engine, container, cache_unit), {})


@deploy("modelfleet verify")
def run(ctx: HostRun):
    plan = ctx.plan
    alone = ctx.alone
    for svc in plan.services:
        if weight_cache.spec(svc):  # every rank maps (or loads) its own shard
            weight_load_reported(name=f"Weight load of {svc.served_name} (restart tier)", svc_name=svc.pool,
                                 engine=svc.engine_name, container=svc.container_name,
                                 cache_unit=weight_cache.unit_name(svc))
        if svc.node_rank:
            continue  # a pool is verified at its head
        tunnel = None if reachable_from_control_node(plan, svc) else (svc.bind_address, svc.port)
        endpoint_verified(name=f"Verify {svc.served_name} at {svc.base_url}", ep=endpoint(plan, svc),
                          tunnel=tunnel, ready_timeout_s=min(svc.recipe.ready_timeout_s, 120),
                          with_bench=plan.verify_bench, pool=svc.pool,
                          full=alone or plan.verify_full or plan.verify_bench or ctx.pool_starts(svc.pool))
