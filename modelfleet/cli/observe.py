"""What the hosts are doing, asked over SSH or HTTP without changing them: verify, bench, cost, status, logs,
tunnel."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from modelfleet.base import keys, masking
from modelfleet.cli.common import emit, inventory_options, limit_option, main, resolved_or_exit, selected
from modelfleet.run.checks import Endpoint, inventory_endpoints
from modelfleet.run.checks.cost import PriceError, cost_per_task, load_prices
from modelfleet.run.checks.tunnel import port_free


def _inventory_endpoints(inventory: str, hosts: tuple[str, ...], group_data=(), data=()):
    result = resolved_or_exit(inventory, group_data, data)
    return inventory_endpoints(result, tuple(selected(result, hosts)))


@main.command()
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@limit_option
@click.option("--ready-timeout", type=click.FloatRange(min=0, max=86400), default=60, show_default=True,
              help="Seconds to wait for /health.")
@inventory_options
def verify(inventory: str, limit, hosts, ready_timeout: float, group_data, data) -> None:
    """Readiness, smoke and tool-call/multi-turn probe of every endpoint (JSON; exit 1 if any fails)."""
    endpoints = _inventory_endpoints(inventory, tuple(limit) + tuple(hosts), group_data, data)
    # the openai SDK (hundreds of modules) loads only when verify runs
    from modelfleet.run.checks.probe import verify as verify_endpoint

    reports = [verify_endpoint(ep, ready_timeout) for ep in endpoints]
    click.echo(json.dumps(reports, indent=2))
    sys.exit(0 if all(r["ok"] for r in reports) else 1)


@main.command()
@click.argument("inventory", required=False, type=click.Path(exists=True, dir_okay=False))
@limit_option
@click.option("--base-url", help="Bench this OpenAI-compatible API instead (e.g. a hosted one), without /v1.")
@click.option("--model", help="Model name for --base-url.")
@click.option("--api-key-env", help="Environment variable holding the key for --base-url.")
@click.option("--concurrency", default="1,4,16", show_default=True, help="Comma-separated levels.")
@click.option("--num-prompts", type=click.IntRange(min=1, max=1_000_000), default=32, show_default=True,
              help="Tasks per level.")
@click.option("--input-len", type=click.IntRange(min=1, max=4_194_304), default=128, show_default=True,
              help="Prompt tokens per task.")
@click.option("--output-len", type=click.IntRange(min=1, max=4_194_304), default=128, show_default=True,
              help="Tokens generated per task.")
@click.option("--retries", type=click.IntRange(min=0, max=100), default=0, show_default=True,
              help="Re-sends of a failed task.")
@click.option("--no-metrics", is_flag=True, help="Do not scrape the engine's /metrics during the run.")
@click.option("--no-gpu-memory", is_flag=True, help="Do not sample the serving hosts' GPU memory (nvidia-smi over "
                                                      "SSH) during the run.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="reports/bench", show_default=True,
              help="Where the JSON and PNG reports go.")
@inventory_options
def bench(inventory, limit, hosts, base_url, model, api_key_env, concurrency, num_prompts, input_len, output_len,
          retries, no_metrics, no_gpu_memory, out_dir, group_data, data) -> None:
    """Acceptance bench (vLLM bench serve definitions): JSON + PNG per endpoint; exit 1 on regressions."""
    if bool(inventory) == bool(base_url):
        raise click.UsageError("give an INVENTORY or --base-url (with --model), not both")
    if base_url:
        if not model:
            raise click.UsageError("--base-url needs --model")
        key = keys.from_env(api_key_env)
        if api_key_env and not key:
            raise click.UsageError(f"--api-key-env {api_key_env} is not set")
        masking.learn(key)
        endpoints = [Endpoint(name=base_url.split("//")[-1], base_url=base_url.rstrip("/").removesuffix("/v1"),
                              model=model, engine="remote", api_key=key)]
        readers = {}
    else:
        # the openai SDK (hundreds of modules) loads only when bench runs
        from modelfleet.run.checks.bench import host_gpu_memory

        result = resolved_or_exit(inventory, group_data, data)
        endpoints = inventory_endpoints(result, tuple(selected(result, limit, hosts)))
        plans = {f"{name}/{svc.pool}": plan for name, plan in result.hosts.items() for svc in plan.services}
        readers = {} if no_gpu_memory else {ep.name: host_gpu_memory(plans[ep.name]) for ep in endpoints}
    # the openai SDK (hundreds of modules) loads only when bench runs
    from modelfleet.run.checks.bench import bench as run_bench

    try:
        levels = [int(c) if c.strip().isascii() else -1 for c in concurrency.split(",")]  # `١` is no digit here
        if any(level < 1 for level in levels):
            raise ValueError
    except ValueError:
        raise click.UsageError(f"--concurrency must be integers (1 or more) separated by commas, "
                               f"got {concurrency!r}") from None
    results = []
    for ep in endpoints:
        def progress(level, ep=ep):
            click.echo(f"{ep.name}: concurrency {level['concurrency']}: "
                       f"{level['completed']}/{level['num_prompts']} ok, "
                       f"TTFT p99 {level['ttft']['p99_ms']} ms, {level['output_throughput']} tok/s", err=True)
        results.append(run_bench(ep, levels, num_prompts, input_len, output_len, Path(out_dir), retries,
                                 not no_metrics, progress, gpu_memory=readers.get(ep.name)))
    click.echo(json.dumps(results, indent=2))
    sys.exit(1 if any(r["regressions"] for r in results) else 0)


@main.command()
@click.option("--run", "runs", multiple=True, required=True, metavar="LABEL=BENCH.json:PRICES.yaml",
              help="One row of the table: a bench result and its prices (repeat for a side-by-side).")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def cost(runs: tuple[str, ...], as_json: bool) -> None:
    """Cost per successful task: (compute or API + storage/network + operations + human correction) / tasks."""
    rows = []
    for run in runs:
        label, _, rest = run.partition("=")
        bench_path, _, prices_path = rest.rpartition(":")
        if not (label and bench_path and prices_path):
            raise click.UsageError(f"--run {run!r}: expected LABEL=BENCH.json:PRICES.yaml")
        try:
            prices = load_prices(Path(prices_path))
        except (OSError, PriceError) as error:
            raise click.UsageError(str(error)) from error
        try:
            result = json.loads(Path(bench_path).read_text())
        except (OSError, ValueError) as error:
            raise click.UsageError(f"--run {run!r}: {bench_path}: not a bench result ({error})") from None
        rows.append({"label": label, **cost_per_task(result, prices)})
    text = "\n".join(f"{r['label']:<16} ${r['cost_per_successful_task_usd']} per task "
                     f"({r['successful_tasks']} tasks, total ${r['total_usd']}: {r['basis']})" for r in rows)
    emit(rows, as_json, text)


def _plans(inventory: str, hosts: tuple[str, ...], group_data=(), data=()):
    result = resolved_or_exit(inventory, group_data, data)
    return [result.hosts[name] for name in selected(result, hosts)]


@main.command()
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@limit_option
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@inventory_options
def status(inventory: str, limit, hosts, as_json: bool, group_data, data) -> None:
    """Per host: unit state, image, model revision, endpoint health, restarts, GPUs (concurrently, over SSH)."""
    # fleet loads fabric's SSH client: only the commands that reach hosts pay for it
    from modelfleet.fleet import status as fleet_status

    rows = fleet_status.status(_plans(inventory, tuple(limit) + tuple(hosts), group_data, data))
    emit(rows, as_json, fleet_status.status_table(rows))
    sys.exit(0 if all(r["reachable"] for r in rows) else 1)


@main.command()
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@click.argument("patterns", nargs=-1, metavar="[HOST|GROUP]...")
@click.option("--limit", "limit", multiple=True, metavar="HOST|GROUP",
              help="Only these hosts: a name, a glob or a group, as pyinfra's --limit (repeatable).")
@click.option("-n", "--lines", type=click.IntRange(min=1, max=1_000_000), default=50, show_default=True,
              help="Journal lines per unit.")
@click.option("-f", "--follow", is_flag=True, help="Keep following (Ctrl-C to stop).")
@inventory_options
def logs(inventory: str, patterns, limit, lines: int, follow: bool, group_data, data) -> None:
    """The engine units' journal from the hosts given (names, globs or groups; default: all), each line
    prefixed by its host."""
    # fleet loads fabric's SSH client: only the commands that reach hosts pay for it
    from modelfleet.fleet import status as fleet_status

    try:
        fleet_status.logs(_plans(inventory, tuple(patterns) + tuple(limit), group_data, data), lines, follow)
    except KeyboardInterrupt:
        pass


@main.command()
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@click.argument("host")
@click.option("--pool", help="Which of the host's services (default: its first).")
@click.option("--local-port", type=click.IntRange(min=1, max=65535),
              help="Local port (default: the endpoint's own port).")
@inventory_options
def tunnel(inventory: str, host: str, pool: str | None, local_port: int | None, group_data, data) -> None:
    """Forward a local port to HOST's loopback-bound endpoint (ssh -N -L) and print the base_url to use."""
    # fleet loads fabric's SSH client: only the commands that reach hosts pay for it
    from modelfleet.fleet import status as fleet_status

    [plan] = _plans(inventory, (host,), group_data, data)
    services = [s for s in plan.services if pool in (None, s.pool)]
    if not services:
        raise click.UsageError(f"{host} serves no pool {pool!r}")
    svc = services[0]
    port = local_port or svc.port
    if not port_free(port):
        raise click.UsageError(f"local port {port} is already in use: choose another with --local-port")
    conn, forwarding = fleet_status.tunnel(plan, svc, port)
    with forwarding as bound:
        click.echo(json.dumps({"host": host, "pool": svc.pool, "model": svc.served_name,
                               "base_url": f"http://127.0.0.1:{bound}/v1",
                               "remote": f"{svc.bind_address}:{svc.port}"}), nl=True)
        sys.stdout.flush()
        try:
            while conn.is_connected:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
    conn.close()
