"""modelfleet command line: validate, plan, render, admit, converge, verify, bench, cost, status, logs, tunnel,
prometheus, mirror, urls, retire (and the lab)."""

from __future__ import annotations

import json
import sys
import time

import click

from modelfleet import masking, render, runscope
from modelfleet.catalog import load_catalog
from modelfleet.commands import inventory_args
from modelfleet.inventory import open_inventory
from modelfleet.inventory.door import parse_data
from modelfleet.planner import plan_capacity, split_lines


def _emit(data, as_json: bool, text: str) -> None:
    click.echo(masking.mask(json.dumps(masking.masked(data), indent=2, default=str) if as_json else text))


def inventory_options(command):
    """pyinfra's own options for what the inventory holds (`--group-data`, `--data`): every command reads the
    inventory as `pyinfra INVENTORY ... --group-data ... --data ...` started here would."""
    command = click.option("--data", "data", multiple=True, metavar="KEY=VALUE",
                           help="Override data for every host, as pyinfra's --data (repeatable).")(command)
    return click.option("--group-data", "group_data", multiple=True, type=click.Path(exists=True, file_okay=False),
                        help="Another group_data folder, as pyinfra's --group-data (repeatable).")(command)


def limit_option(command):
    """pyinfra's `--limit` (a host name, a glob of host names, or a group; repeatable); `--host` is the same."""
    command = click.option("--host", "hosts", multiple=True, hidden=True)(command)
    return click.option("--limit", "limit", multiple=True, metavar="HOST|GROUP",
                        help="Only these hosts: a name, a glob or a group, as pyinfra's --limit (repeatable).")(command)


def _selected(result, limit=(), hosts=()) -> list[str]:
    from modelfleet.inventory.door import limit as pick

    try:
        return pick(result, tuple(limit) + tuple(hosts))
    except ValueError as error:
        raise click.UsageError(str(error)) from None


def _open(inventory: str, group_data=(), data=(), offline: bool = False):
    try:
        overrides = parse_data(data)
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    result = open_inventory(inventory, group_data=tuple(group_data), data=overrides, offline=offline)
    masking.learn_inventory(result)  # whatever prints next (a row, a unit, an exception) masks them
    return result


def _catalog():
    """The shipped catalog, or one line naming its broken file and field (exit 2)."""
    from modelfleet.catalog import CatalogError

    try:
        return load_catalog()
    except CatalogError as error:
        click.echo(f"modelfleet: the catalog is broken: {error}", err=True)
        sys.exit(2)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option()
@click.pass_context
def main(ctx: click.Context) -> None:
    """Turn GPU servers into serving nodes for open-weight models (pyinfra stages + checks)."""
    ctx.with_resource(runscope.scope())  # a command resolves each digest and checkpoint once, like a run
    ctx.with_resource(masking.streams())  # every line a command prints goes through the one mask


@main.command()
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@inventory_options
@click.option("--offline", is_flag=True, help="Do not look at the control node's secrets (API keys, hub token): "
                                              "those checks are reported as skipped; for CI.")
@click.option("--strict", is_flag=True, help="Warnings are errors (exit 2).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def validate(inventory: str, group_data, data, offline: bool, strict: bool, as_json: bool) -> None:
    """Check INVENTORY against the catalog, as `pyinfra INVENTORY ...` run from here would load it; report
    every problem at once (exit 2 if any), then warnings and the files read."""
    result = _open(inventory, group_data, data, offline)
    refused = result.errors + (result.warnings if strict else [])

    from modelfleet.router import summary as door_summary

    def listed(problems):
        return [{"where": w, "field": f, "message": m} for w, f, m in problems]

    out = {"ok": not refused, "hosts": sorted(result.hosts), "pools": {
        name: {"hosts": pool.hosts, "recipe": pool.services[0].recipe.id} for name, pool in result.pools.items()},
        "errors": listed(refused), "warnings": listed(result.warnings), "skipped": listed(result.skipped),
        "info": listed(result.info),
        "group_data_files": result.group_data_files, "site_recipe_files": result.site_recipe_files,
        "site_hardware_files": result.site_hardware_files,
        "front_doors": [door_summary(rp) for rp in result.routers.values()]}
    lines = [result.error_report(refused)] if refused else [
        f"ok: {len(result.hosts)} host(s), {len(result.pools)} pool(s)"] + [
        f"front door {d['name']} on {d['host']}: {d['url']} ({'TLS' if d['tls'] else 'plain HTTP'}), "
        f"{len(d['replicas'])} replica(s)" for d in out["front_doors"]]
    if not strict:
        lines += [f"warning: {w}: {f}: {m}" for w, f, m in result.warnings]
    lines += [f"skipped: {w}: {f}: {m}" for w, f, m in result.skipped]
    lines += [f"note: {w}: {f}: {m}" for w, f, m in result.info]
    lines.append("group_data read: " + (", ".join(result.group_data_files) or
                                        "none (looked in " + ", ".join(result.group_data_folders) + ")"))
    if result.site_recipe_files:
        lines.append("site recipes read: " + ", ".join(result.site_recipe_files))
    if result.site_hardware_files:
        lines.append("site boards read: " + ", ".join(result.site_hardware_files))
    _emit(out, as_json, "\n".join(lines))
    sys.exit(2 if refused else 0)


@main.command()
@click.argument("inventory", required=False, type=click.Path(exists=True, dir_okay=False))
@click.argument("host", required=False)
@inventory_options
@click.option("--model", help="Catalog model id, e.g. kimi-k3.1-pro (without INVENTORY).")
@click.option("--hardware", help="Catalog hardware id, e.g. b300 (without INVENTORY).")
@click.option("--gpus", type=click.IntRange(min=1, max=72), help="GPUs per node (without INVENTORY).")
@click.option("--nodes", type=click.IntRange(min=1, max=1024), default=1, show_default=True, help="Hosts in the pool.")
@click.option("--keep-revisions", type=click.IntRange(min=0, max=100), default=1, show_default=True,
              help="Rollback copies kept on disk.")
@click.option("--recipe", "recipe_id", help="Size this catalog recipe (default: the first of MODEL on HARDWARE).")
@click.option("--quant", help="GGUF quantization, e.g. UD-IQ1_M: a llama.cpp recipe of MODEL with it on HARDWARE.")
@click.option("--host-ram-gib", type=click.IntRange(min=1, max=65536), help="Host RAM for recipes that keep MoE experts in RAM "
              "(default: the hardware catalog's figure).")
@click.option("--json", "as_json", is_flag=True, help="Print the full plan as JSON.")
def plan(inventory, host, group_data, data, model: str, hardware: str, gpus: int, nodes: int, keep_revisions: int,
         recipe_id: str | None, quant: str | None, host_ram_gib: int | None, as_json: bool) -> None:
    """Size MODEL on GPUS x HARDWARE (x NODES), or each service of INVENTORY's HOST as written (its recipe, GPUs,
    pool size, host RAM and kept revisions; refused as validate refuses): weights per GPU, KV-cache room, disk;
    for llama.cpp recipes that keep MoE experts in host RAM, the split between GPUs and RAM. Exit 1 if it
    cannot work."""
    if inventory:
        if not host:
            raise click.UsageError("give the HOST of INVENTORY to plan")
        result = _resolved_or_exit(inventory, group_data, data)
        if host not in result.hosts:
            raise click.UsageError(f"no host {host!r} in {inventory} (hosts: {', '.join(result.hosts)})")
        target = result.hosts[host]
        reports = [(svc.recipe, plan_capacity(svc.model, svc.hardware, svc.gpus, svc.nnodes, recipe=svc.recipe,
                                              keep_revisions=target.model_keep_revisions,
                                              host_ram_gib=target.host_ram_gib)) for svc in target.services]
        _emit([{**r.to_json(), "recipe": recipe.id if recipe else None} for recipe, r in reports], as_json, "\n\n".join(_plan_text(r, recipe) for recipe, r in reports)
              or f"{host} serves no model (router_only): nothing to size")
        sys.exit(0 if all(r.fits for _, r in reports) else 1)
    if not (model and hardware and gpus):
        raise click.UsageError("give INVENTORY HOST, or --model, --hardware and --gpus")
    cat = _catalog()
    for kind, value, table in (("model", model, cat.models), ("hardware", hardware, cat.hardware)):
        if value not in table:
            raise click.UsageError(f"unknown {kind} {value!r} (known: {', '.join(sorted(table))})")
    recipes = [r for r in cat.recipes.values() if r.model == model and hardware in r.hardware]
    if recipe_id:
        if recipe_id not in cat.recipes:
            raise click.UsageError(f"unknown recipe {recipe_id!r}")
        if cat.recipes[recipe_id] not in recipes:
            raise click.UsageError(f"recipe {recipe_id} is not for {model} on {hardware} (it is for "
                                   f"{cat.recipes[recipe_id].model} on {', '.join(cat.recipes[recipe_id].hardware)})")
        recipes = [cat.recipes[recipe_id]]
    if quant:
        recipes = [r for r in recipes if r.gguf_quant == quant]
        if not recipes:
            raise click.UsageError(f"no recipe of {model} on {hardware} with GGUF quantization {quant!r}")
    # A recipe sizes only the layout it was written for; any other layout is an estimate without one.
    laid_out = [r for r in recipes if (r.layout.nodes, r.layout.gpus_per_node) == (nodes, gpus)]
    if recipe_id and not laid_out:
        r = recipes[0]
        raise click.UsageError(f"recipe {recipe_id} is laid out for {r.layout.nodes}x{r.layout.gpus_per_node} GPUs, "
                               f"not {nodes}x{gpus}")
    if recipes and not laid_out:
        click.echo(f"note: no recipe of {model} on {hardware} is laid out for {nodes}x{gpus} GPUs (recipes: " +
                   ", ".join(f"{r.id} {r.layout.nodes}x{r.layout.gpus_per_node}" for r in recipes) +
                   "); this is an estimate at the default memory fraction, nothing can deploy it", err=True)
    recipe = laid_out[0] if laid_out else None
    report = plan_capacity(cat.models[model], cat.hardware[hardware], gpus, nodes, recipe=recipe,
                           keep_revisions=keep_revisions, host_ram_gib=host_ram_gib)
    _emit({**report.to_json(), "recipe": recipe.id if recipe else None}, as_json, _plan_text(report, recipe))
    sys.exit(0 if report.fits else 1)


def _plan_text(report, recipe) -> str:
    lines = [
        f"{report.model} on {report.nodes}x{report.gpus_per_node} {report.hardware}" + (f" (recipe {recipe.id})" if recipe else ""),
        "raw parameter bytes: " + ", ".join(f"{k} {v / 1e12:.2f} TB" for k, v in report.raw_bytes.items()),
        f"checkpoint: {report.checkpoint_bytes / 1e12:.3f} TB" + (" (estimated)" if report.checkpoint_estimated
                                                                  else ""),
        f"weights per GPU: {report.weights_per_gpu_bytes / 1e9:.1f} GB of "
        f"{report.usable_per_gpu_bytes / 1e9:.1f} GB usable; KV-cache room {report.kv_room_per_gpu_bytes / 1e9:.1f} GB",
        *split_lines(report),
        f"disk needed per host: {report.disk_needed_bytes / 1e12:.3f} TB", report.reason,
    ]
    return "\n".join(lines)


@main.command("render")
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@click.argument("host")
@inventory_options
@click.option("--json", "as_json", is_flag=True, help="Print the files (path, mode, content) and notes as JSON.")
@click.option("--pin", is_flag=True, help="Ask the registry for each image's digest and the hub (or mirror) for "
              "the revision's commit, as the run does, so the files shown are byte for byte the run's.")
def render_cmd(inventory: str, host: str, group_data, data, as_json: bool, pin: bool) -> None:
    """Print HOST's systemd unit(s) and env file(s) as the run writes them, secrets masked. Without --pin, images
    by tag and the revision as written (the run pins them, and the engine cache directory is named after the
    pins); with --pin, as pinned."""
    from modelfleet import engine_flags, image_runtime
    from modelfleet.errors import ModelfleetError
    from modelfleet.inventory import COMMIT_RE
    from modelfleet.pins import pinned_service

    result = _resolved_or_exit(inventory, group_data, data)
    if host not in result.hosts:
        raise click.UsageError(f"no host {host!r} in {inventory} (hosts: {', '.join(sorted(result.hosts))})")
    files, notes = [], []
    plan = result.hosts[host]
    for svc in plan.services:
        if pin:
            try:
                svc = pinned_service(plan, svc)
            except ModelfleetError as error:
                click.echo(f"modelfleet render --pin: {host}: pool {svc.pool}: {error}", err=True)
                sys.exit(1)
        elif "@sha256:" not in svc.image or not COMMIT_RE.match(svc.revision or ""):
            notes.append(f"image {svc.image} and revision {svc.revision or 'main'} as written: the run pins them "
                         "(digest, commit) and names the engine cache directory after the pins (render --pin "
                         "shows them pinned)")
        notes.append(f"recipe {svc.recipe.id} ({'verified' if svc.recipe.verified else 'not verified'} by "
                     f"modelfleet; source: {svc.recipe.source})")
        flags = engine_flags.table(svc.engine_name, svc.engine.flag_parser)
        notes.append(f"image {svc.image}: " + engine_flags.check_claim(svc.recipe, svc.engine_name, flags,
                                                                       site=bool(svc.recipe.site)))
        notes.append(image_runtime.render_note(svc.image, svc.recipe.cuda, svc.recipe.rocm, svc.recipe.runtime_source,
                                               svc.hardware.vendor, plan.stack.driver_branch))
        fraction = (f"{svc.engine.memory_fraction_flag} {svc.recipe.memory_fraction}" if svc.engine.memory_fraction_flag
                    else f"{svc.recipe.memory_fraction} (planning only: {svc.engine_name} has no such flag)")
        notes.append(f"memory fraction the plan sized with: {fraction}; clients call it: "
                     f"{', '.join(render.served_names(svc))}; GPUs: {', '.join(map(str, svc.gpu_indices)) or 'none'}")
        if svc.hardware.vendor == "amd" and svc.gpu_passthrough:
            notes.append("the run adds the host's render group by number (`getent group render` on the host, read "
                         "with preflight's probe) after `--group-add video`: a name would resolve in the image")
        if not pin and svc.model_file and any(c in svc.model_file for c in "*?["):
            notes.append(f"model file {svc.model_file} is a pattern: the run names the revision's first matching "
                         "file (sorted, e.g. the GGUF's -00001-of- shard) in the unit; systemd and docker never "
                         "expand it")
        svc = _with_expected_fabric(result, svc, notes)
        files.append({"path": f"/etc/systemd/system/{svc.unit_name}", "mode": "0644",
                      "content": render.render_unit(svc)})
        files.append({"path": svc.env_file, "mode": "0600", "content": render.render_env(svc, mask=True)})
        secrets = render.render_secrets_config(svc, mask=True)
        if secrets:
            files.append({"path": svc.secrets_config_file, "mode": "0600", "content": secrets})
    for rp in plan.routers:  # the front doors this host runs (modelfleet.router)
        from modelfleet.router import preview
        door_files, door_notes = preview(rp)
        files, notes = files + door_files, notes + door_notes
    files, notes = masking.masked(files), masking.masked(notes)
    if as_json:
        click.echo(json.dumps({"host": host, "files": files, "notes": notes}, indent=2))
        return
    click.echo("\n".join(f"# {note}" for note in notes))
    for f in files:
        click.echo(f"# ==> {f['path']}" + (f" ({f['mode']})" if f["mode"] == "0600" else ""))
        click.echo(f["content"])


def _with_expected_fabric(result, svc, notes: list[str]):
    """A pool across hosts: the fabric the run would derive for this member from what the inventory and the
    catalog say (the facts decide at run time), with the reason for each value."""
    from dataclasses import replace

    from modelfleet import fabric

    if svc.nnodes == 1:
        return svc
    expected = getattr(fabric, "expected", None)
    if expected is None:
        notes.append(f"pool {svc.pool} fabric: derived from the members' facts when the run starts")
        return svc
    pool = expected(svc.pool, [result.hosts[name] for name in result.pools[svc.pool].hosts])
    notes += [f"pool {svc.pool} fabric: refused: {where}: {field}: {message}" for where, field, message in pool.errors]
    mine = pool.hosts.get(svc.host)
    if mine is None:
        return svc
    notes += [f"fabric {name}: {why}" for name, why in mine.reasons.items()]
    return replace(svc, fabric=mine)


@main.command()
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@click.argument("host")
@inventory_options
@click.option("--json", "as_json", is_flag=True, help="Print the settings as JSON.")
def show(inventory: str, host: str, group_data, data, as_json: bool) -> None:
    """HOST's merged settings and where each value came from (the inventory file, a group_data file, --data,
    or the schema's default), as the run will see them; secrets masked. An inventory that does not validate
    is shown too, with the host's errors under the settings (exit 2 when there are any)."""
    from modelfleet.inventory.schema import HostData

    result = _open(inventory, group_data, data)
    if host not in result.data:
        if result.errors and not result.data:
            click.echo(result.error_report(), err=True)
            sys.exit(2)
        raise click.UsageError(f"no host {host!r} in {inventory} (hosts: {', '.join(result.data)})")
    given, sources = result.data[host], result.sources.get(host, {})
    rows = [{"key": k, "value": masking.MASK if masking.secret_name(k) else masking.masked(v),
             "from": sources.get(k, "?")} for k, v in sorted(given.items())]
    rows += [{"key": k, "value": f.default, "from": "default"} for k, f in HostData.model_fields.items()
             if k not in given and k != "services"]
    width = max(len(r["key"]) for r in rows)
    text = "\n".join(f"{r['key']:<{width}}  {json.dumps(r['value'], default=str)}  ({r['from']})" for r in rows)
    from modelfleet.inventory import endpoints  # the front doors it runs, the services it serves

    found = endpoints.rows(result, host)
    rows += [{"key": f"endpoint: {e['endpoint']}", "value": e, "from": "the resolved plan"} for e in found]
    _emit(rows, as_json, text + "".join(f"\nendpoint: {line}" for line in endpoints.lines(found)))
    if result.errors:
        mine = [e for e in result.errors if e[0] == f"host {host}" or e[2].startswith(f"host {host} ")]
        others = len(result.errors) - len(mine)
        click.echo(("errors:\n" + result.error_report(mine) if mine else f"no error names host {host}") +
                   (f"\n({others} more error(s) elsewhere in the inventory: modelfleet validate lists them)"
                    if others else ""), err=as_json)
        sys.exit(2 if mine else 0)


@main.command("catalog")
@click.option("--json", "as_json", is_flag=True, help="Print the catalog as JSON.")
def catalog_cmd(as_json: bool) -> None:
    """The shipped catalog: models, hardware, and which recipe serves which model on which board with which
    engine (verified by modelfleet, or from a guide only)."""
    cat = _catalog()
    out = {"models": {m.id: {"hf_repo": m.hf_repo, "params_total": m.params_total, "weights": m.weights}
                      for m in cat.models.values()},
           "hardware": {h.id: {"vendor": h.vendor, "gpu": h.gpu_name, "gpus_per_node": h.gpus_per_node}
                        for h in cat.hardware.values()},
           "recipes": {r.id: {"model": r.model, "engine": r.engine, "hardware": r.hardware, "verified": r.verified,
                              "nodes": r.layout.nodes, "gpus_per_node": r.layout.gpus_per_node,
                              "source": r.source} for r in cat.recipes.values()}}
    lines = ["models:"] + [f"  {k}  ({v['hf_repo']}, {v['params_total']}B, {v['weights']})"
                           for k, v in out["models"].items()]
    lines += ["hardware:"] + [f"  {k}  ({v['vendor']} {v['gpu'] or '-'} x{v['gpus_per_node']})"
                              for k, v in out["hardware"].items()]
    lines += ["recipes:"] + [f"  {k}  {v['model']} / {v['engine']} on {', '.join(v['hardware'])} "
                             f"({v['nodes']} node(s) x {v['gpus_per_node']} GPUs; "
                             f"{'verified' if v['verified'] else 'not verified'})" for k, v in out["recipes"].items()]
    _emit(out, as_json, "\n".join(lines))


def _resolved_or_exit(inventory: str, group_data=(), data=()):
    result = _open(inventory, group_data, data)
    if result.errors:
        click.echo(result.error_report(), err=True)
        sys.exit(2)
    return result


def _inventory_endpoints(inventory: str, hosts: tuple[str, ...], group_data=(), data=()):
    from modelfleet.checks import inventory_endpoints

    result = _resolved_or_exit(inventory, group_data, data)
    return inventory_endpoints(result, tuple(_selected(result, hosts)))


@main.command()
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@limit_option
@click.option("--ready-timeout", type=click.FloatRange(min=0, max=86400), default=60, show_default=True, help="Seconds to wait for /health.")
@inventory_options
def verify(inventory: str, limit, hosts, ready_timeout: float, group_data, data) -> None:
    """Readiness, smoke and tool-call/multi-turn probe of every endpoint (JSON; exit 1 if any fails)."""
    endpoints = _inventory_endpoints(inventory, tuple(limit) + tuple(hosts), group_data, data)
    from modelfleet.checks.probe import verify as verify_endpoint

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
@click.option("--num-prompts", type=click.IntRange(min=1, max=1_000_000), default=32, show_default=True, help="Tasks per level.")
@click.option("--input-len", type=click.IntRange(min=1, max=4_194_304), default=128, show_default=True, help="Prompt tokens per task.")
@click.option("--output-len", type=click.IntRange(min=1, max=4_194_304), default=128, show_default=True, help="Tokens generated per task.")
@click.option("--retries", type=click.IntRange(min=0, max=100), default=0, show_default=True, help="Re-sends of a failed task.")
@click.option("--no-metrics", is_flag=True, help="Do not scrape the engine's /metrics during the run.")
@click.option("--no-gpu-memory", is_flag=True, help="Do not sample the serving hosts' GPU memory (nvidia-smi over "
                                                      "SSH) during the run.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="reports/bench", show_default=True, help="Where the JSON and PNG reports go.")
@inventory_options
def bench(inventory, limit, hosts, base_url, model, api_key_env, concurrency, num_prompts, input_len, output_len,
          retries, no_metrics, no_gpu_memory, out_dir, group_data, data) -> None:
    """Acceptance bench (vLLM bench serve definitions): JSON + PNG per endpoint; exit 1 on regressions."""
    import os
    from pathlib import Path

    from modelfleet.checks import Endpoint

    if bool(inventory) == bool(base_url):
        raise click.UsageError("give an INVENTORY or --base-url (with --model), not both")
    if base_url:
        if not model:
            raise click.UsageError("--base-url needs --model")
        key = os.environ.get(api_key_env) if api_key_env else None
        if api_key_env and not key:
            raise click.UsageError(f"--api-key-env {api_key_env} is not set")
        masking.learn(key)
        endpoints = [Endpoint(name=base_url.split("//")[-1], base_url=base_url.rstrip("/").removesuffix("/v1"),
                              model=model, engine="remote", api_key=key)]
        readers = {}
    else:
        from modelfleet.checks import inventory_endpoints
        from modelfleet.checks.bench import host_gpu_memory

        result = _resolved_or_exit(inventory, group_data, data)
        endpoints = inventory_endpoints(result, tuple(_selected(result, limit, hosts)))
        plans = {f"{name}/{svc.pool}": plan for name, plan in result.hosts.items() for svc in plan.services}
        readers = {} if no_gpu_memory else {ep.name: host_gpu_memory(plans[ep.name]) for ep in endpoints}
    from modelfleet.checks.bench import bench as run_bench

    try:
        levels = [int(c) for c in concurrency.split(",")]
        if any(level < 1 for level in levels):
            raise ValueError
    except ValueError:
        raise click.UsageError(f"--concurrency must be integers (1 or more) separated by commas, got {concurrency!r}") from None
    results = []
    for ep in endpoints:
        def progress(level, ep=ep):
            click.echo(f"{ep.name}: concurrency {level['concurrency']}: {level['completed']}/{level['num_prompts']} ok, "
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
    from pathlib import Path

    from modelfleet.checks.cost import PriceError, cost_per_task, load_prices

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
        rows.append({"label": label, **cost_per_task(json.loads(Path(bench_path).read_text()), prices)})
    text = "\n".join(f"{r['label']:<16} ${r['cost_per_successful_task_usd']} per task "
                     f"({r['successful_tasks']} tasks, total ${r['total_usd']}: {r['basis']})" for r in rows)
    _emit(rows, as_json, text)


def _plans(inventory: str, hosts: tuple[str, ...], group_data=(), data=()):
    result = _resolved_or_exit(inventory, group_data, data)
    return [result.hosts[name] for name in _selected(result, hosts)]


@main.command()
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@limit_option
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@inventory_options
def status(inventory: str, limit, hosts, as_json: bool, group_data, data) -> None:
    """Per host: unit state, image, model revision, endpoint health, restarts, GPUs (concurrently, over SSH)."""
    from modelfleet import fleet

    rows = fleet.status(_plans(inventory, tuple(limit) + tuple(hosts), group_data, data))
    _emit(rows, as_json, fleet.status_table(rows))
    sys.exit(0 if all(r["reachable"] for r in rows) else 1)


@main.command()
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@click.argument("patterns", nargs=-1, metavar="[HOST|GROUP]...")
@click.option("--limit", "limit", multiple=True, metavar="HOST|GROUP",
              help="Only these hosts: a name, a glob or a group, as pyinfra's --limit (repeatable).")
@click.option("-n", "--lines", type=click.IntRange(min=1, max=1_000_000), default=50, show_default=True, help="Journal lines per unit.")
@click.option("-f", "--follow", is_flag=True, help="Keep following (Ctrl-C to stop).")
@inventory_options
def logs(inventory: str, patterns, limit, lines: int, follow: bool, group_data, data) -> None:
    """The engine units' journal from the hosts given (names, globs or groups; default: all), each line
    prefixed by its host."""
    from modelfleet import fleet

    try:
        fleet.logs(_plans(inventory, tuple(patterns) + tuple(limit), group_data, data), lines, follow)
    except KeyboardInterrupt:
        pass


@main.command()
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@click.argument("host")
@click.option("--pool", help="Which of the host's services (default: its first).")
@click.option("--local-port", type=click.IntRange(min=1, max=65535), help="Local port (default: the endpoint's own port).")
@inventory_options
def tunnel(inventory: str, host: str, pool: str | None, local_port: int | None, group_data, data) -> None:
    """Forward a local port to HOST's loopback-bound endpoint (ssh -N -L) and print the base_url to use."""
    import time

    from modelfleet import fleet
    from modelfleet.checks.tunnel import port_free

    [plan] = _plans(inventory, (host,), group_data, data)
    services = [s for s in plan.services if pool in (None, s.pool)]
    if not services:
        raise click.UsageError(f"{host} serves no pool {pool!r}")
    svc = services[0]
    port = local_port or svc.port
    if not port_free(port):
        raise click.UsageError(f"local port {port} is already in use: choose another with --local-port")
    conn, forwarding = fleet.tunnel(plan, svc, port)
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


@main.command()
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@click.option("--parallel", type=click.IntRange(min=1), default=1, show_default=True,
              help="Single-node hosts switched at once.")
@click.option("--min-healthy", type=click.IntRange(min=0),
              help="Never leave fewer healthy endpoints than this while a batch switches (default: every model "
                   "served by hosts outside the batch keeps one of them healthy).")
@click.option("--allow-outage", is_flag=True, help="Accept a batch that takes every endpoint of a model down at "
              "once (refused otherwise).")
@click.option("--limit", "limit", multiple=True, metavar="HOST|GROUP",
              help="Only these hosts (a name, a glob or a group, as pyinfra's --limit), with the rest of their "
                   "pools (repeatable).")
@click.option("--dry", is_flag=True, help="Print the batches (JSON), each host's changes (image, revision, driver: "
              "what it runs now, read from it, and what the inventory says) and each batch's drain; run nothing.")
@inventory_options
def upgrade(inventory: str, parallel: int, min_healthy: int | None, allow_outage: bool, limit, dry: bool, group_data,
            data) -> None:
    """Rolling upgrade to what INVENTORY now says (image, revision, driver release): batch by batch (JSON)."""
    import os
    import signal

    from modelfleet.inventory.door import whole
    from modelfleet.rollout import batches, endpoints, outages, rollout

    # Ctrl-C or `kill -INT` stops the rollout where it is and reports how to finish it, also when a shell
    # started this command in the background (which starts it with SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)

    result = _resolved_or_exit(inventory, group_data, data)
    everything, result = result, whole(result, _selected(result, limit), checkpoint_groups=False)
    served = sum(len(heads) for heads in endpoints(everything).values())
    if min_healthy is not None and min_healthy > served:
        raise click.BadParameter(f"{min_healthy} is more than the {served} endpoint(s) {inventory} serves: no "
                                 "batch could ever start", param_hint="--min-healthy")
    down = outages(everything, batches(result, parallel))  # endpoints outside --limit keep serving
    if down and not allow_outage:
        raise click.BadParameter("; ".join(down) + ": lower --parallel, or pass --allow-outage",
                                 param_hint="--parallel")
    if dry:
        from modelfleet.upgrade_dry import preview

        _emit(preview(result, everything, parallel), True, "")
        return
    report = rollout(inventory, result, parallel, min_healthy, env=dict(os.environ),
                     log=lambda line: click.echo(line, err=True), limit=tuple(limit),
                     inventory_args=inventory_args(group_data, data), everything=everything)
    click.echo(json.dumps(report, indent=2))
    sys.exit(0 if not report["stopped"] else 1)


@main.command()
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@click.option("--dcgm", is_flag=True, help="Scrape a DCGM exporter on every NVIDIA host (:9400).")
@click.option("--node-exporter", is_flag=True, help="Scrape a node exporter on every host (:9100).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write here instead of stdout.")
@inventory_options
def prometheus(inventory: str, dcgm: bool, node_exporter: bool, output: str | None, group_data, data) -> None:
    """A Prometheus scrape configuration for the fleet, labelled by pool, host and model."""
    import yaml

    from modelfleet.prometheus import loopback_targets, scrape_config

    result = _resolved_or_exit(inventory, group_data, data)
    text = yaml.safe_dump(scrape_config(result, dcgm, node_exporter), sort_keys=False)
    if output:
        with open(output, "w") as f:
            f.write(text)
    else:
        click.echo(text, nl=False)
    unreachable = loopback_targets(result)
    if unreachable:
        click.echo(f"note: {len(unreachable)} engine(s) listen on their host's loopback ({', '.join(unreachable)}):"
                   " scrape them from an agent on that host, or bind them to the pool network", err=True)


@main.command()
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@limit_option
@inventory_options
def admit(inventory: str, limit, hosts, group_data, data) -> None:
    """GPU admission on every host (pyinfra, nothing changed): each host's checks as JSON; exit 1 if one is
    refused. Reports: reports/admission/<host>.json."""
    from modelfleet.commands import deploy, run_pyinfra
    from modelfleet.operations.report import report_path

    result = _resolved_or_exit(inventory, group_data, data)
    chosen = _selected(result, limit, hosts)
    started = time.time()
    run = run_pyinfra(inventory, deploy("admission"), limit=chosen if (limit or hosts) else (), timeout=600,
                      extra=inventory_args(group_data, data))

    def this_runs(kind: str, name: str) -> dict | None:
        """The host's report of this run (an older one says nothing about this run)."""
        path = report_path(kind, name)
        return json.loads(path.read_text()) if path.exists() and path.stat().st_mtime >= started else None

    reports = []
    for name in chosen:
        preflight = this_runs("preflight", name)
        if preflight and not preflight["ok"]:  # preflight stops a host (e.g. a GPU short) before admission
            report = {"host": name, "ok": False, "refused_by": "preflight", "checks": [],
                      "reasons": preflight["problems"]}
        else:
            report = this_runs("admission", name) or {
                "host": name, "ok": False, "checks": [], "reasons": ["not judged in this run (see pyinfra's output)"]}
        reports.append(report)
    click.echo(json.dumps(reports, indent=2))
    if run.returncode:
        click.echo((run.stdout + run.stderr)[-3000:], err=True)
    sys.exit(0 if run.returncode == 0 and all(r["ok"] for r in reports) else 1)


@main.command()
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@click.argument("deploy", default="modelfleet.deploys.serve")
@click.option("--shards", type=click.IntRange(min=1, max=256), default=1, show_default=True,
              help="pyinfra processes at once, each converging whole pools and checkpoint groups.")
@click.option("--shard", "slice_", metavar="K/N",
              help="Only slice K of N (whole pools and checkpoint groups, the same slices on every control node "
                   "reading this inventory): N control nodes or CI jobs each run one K.")
@click.option("--dry", is_flag=True, help="Print the shards (JSON) and run nothing.")
@click.option("--limit", "limit", multiple=True, metavar="HOST|GROUP",
              help="Only these hosts (a name, a glob or a group, as pyinfra's --limit), with the rest of their "
                   "pools and checkpoint groups (repeatable).")
@inventory_options
def converge(inventory: str, deploy: str, shards: int, slice_: str | None, dry: bool, limit, group_data,
             data) -> None:
    """Run DEPLOY on every host of INVENTORY in SHARDS pyinfra processes at once (a pool or checkpoint group is
    never split), or only slice K/N of them (--shard); each shard's output in reports/converge/shard-<k>.log,
    the summary as JSON; exit 1 if a shard failed."""
    from modelfleet import shards as sharding
    from modelfleet.inventory.door import whole

    result = _resolved_or_exit(inventory, group_data, data)
    chosen = whole(result, _selected(result, limit))
    numbers = of = None
    if slice_:
        if shards != 1:
            raise click.UsageError("--shard K/N runs one slice: leave out --shards")
        try:
            number, of, hosts = sharding.slice_of(chosen, slice_)
        except ValueError as error:
            raise click.UsageError(str(error)) from None
        split, numbers = ([hosts], [number]) if hosts else ([], [])
    else:
        split = sharding.split(chosen, shards)
    if dry or not split:
        named = zip(numbers or range(1, len(split) + 1), split, strict=True)
        click.echo(json.dumps({"shards": [{"shard": n, "hosts": hosts} for n, hosts in named]}, indent=2))
        return
    summary = sharding.converge(inventory, deploy, split, progress=lambda line: click.echo(line, err=True),
                                options=inventory_args(group_data, data), numbers=numbers, of=of)
    click.echo(json.dumps(summary, indent=2))
    sys.exit(0 if summary["ok"] else 1)


@main.command("retire")
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@click.argument("targets", nargs=-1, required=True, metavar="HOST...")
@click.option("--dry", is_flag=True, help="Say what would be retired on each host and change nothing.")
@click.option("--remove-checkpoints", is_flag=True, help="Remove the retired engines' checkpoints too (kept "
              "by default).")
@click.option("--ssh-user", help="SSH user, as pyinfra's --ssh-user.")
@click.option("--ssh-port", type=click.IntRange(min=1, max=65535), help="SSH port, as pyinfra's --ssh-port.")
@click.option("--ssh-key", type=click.Path(exists=True, dir_okay=False), help="SSH key, as pyinfra's --ssh-key.")
@click.option("--known-hosts", type=click.Path(exists=True, dir_okay=False),
              help="known_hosts file for these hosts (pyinfra's ssh_known_hosts_file).")
@click.option("--json", "as_json", is_flag=True, help="Print what was (or would be) retired as JSON.")
@inventory_options
def retire_cmd(inventory: str, targets, dry: bool, remove_checkpoints: bool, ssh_user, ssh_port, ssh_key,
               known_hosts, as_json: bool, group_data, data) -> None:
    """Retire HOSTs that left INVENTORY (each as pyinfra takes a host: an address or name, @ssh/ADDRESS): every
    unit modelfleet wrote there is stopped, disabled and removed with its container and files; units it did not
    write are left alone; checkpoints stay unless --remove-checkpoints. A host INVENTORY still holds is refused
    (exit 2): a converge retires what its inventory drops. Exit 1 when a host could not be retired."""
    from modelfleet import retire

    refused = retire.still_named(_resolved_or_exit(inventory, group_data, data), tuple(targets))
    if refused:
        click.echo("\n".join(f"modelfleet retire: {line}" for line in refused), err=True)
        sys.exit(2)
    options = [*(["--ssh-user", ssh_user] if ssh_user else []), *(["--ssh-port", str(ssh_port)] if ssh_port else []),
               *(["--ssh-key", ssh_key] if ssh_key else []),
               *(["--data", f"ssh_known_hosts_file={known_hosts}"] if known_hosts else [])]
    out = retire.run(tuple(targets), dry, remove_checkpoints, options)
    output = out.pop("output")
    lines = []
    for row in out["hosts"]:
        if row["retired"] is None:  # the deploy never planned there (unreachable, refused)
            lines.append(f"{row['host']}: not reached")
        for r in row["retired"] or []:
            lines.append(f"{row['host']}: {'would retire' if dry else 'retired'} {r['unit']} ({r['what']})"
                         + (f", container {r['container']}" if r["container"] else "")
                         + (f", port {r['port']}" if r["port"] else ""))
        if row["retired"] == []:
            lines.append(f"{row['host']}: no unit modelfleet wrote")
    if not out["ok"]:
        click.echo(output[-3000:], err=True)
    _emit(out, as_json, "\n".join(lines))
    sys.exit(0 if out["ok"] else 1)


@main.command()
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@click.argument("dest", type=click.Path(file_okay=False))
@click.option("--limit", "limit", multiple=True, metavar="HOST|GROUP",
              help="Only the revisions these hosts serve: a name, a glob or a group, as pyinfra's --limit "
                   "(repeatable; default: every host).")
@click.option("--from-host", "from_host", metavar="HOST",
              help="Copy from this host of INVENTORY, which holds the revisions verified (SFTP over the "
                   "inventory's SSH settings), instead of the hub.")
@inventory_options
def mirror(inventory: str, dest: str, limit, from_host: str | None, group_data, data) -> None:
    """Write into DEST the checkpoint mirror that `model_source` reads: every revision INVENTORY's hosts serve,
    as DEST/<hub repo>/<commit>/ with its manifest, each file verified before it is renamed into place. From
    the hub (hf_endpoint, the token hf_token_env names), or --from-host. A re-run copies nothing already
    verified. Progress on stderr, a JSON summary on stdout; exit 1 on failure."""
    from pathlib import Path

    from modelfleet.mirror import MirrorError, build

    result = _resolved_or_exit(inventory, group_data, data)
    try:
        summary = build(result, _selected(result, limit), Path(dest), from_host,
                        log=lambda line: click.echo(line, err=True))
    except MirrorError as error:
        click.echo(f"modelfleet mirror: {error}", err=True)
        sys.exit(1)
    click.echo(json.dumps(summary, indent=2))


@main.command()
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@limit_option
@click.option("--os", "only_os", multiple=True, metavar="ID-VERSION",
              help="Only hosts running this release, e.g. ubuntu-24.04 (repeatable; default: every release the "
                   "GPU stack supports, as nothing is asked of the hosts).")
@click.option("--arch", "arches", multiple=True, type=click.Choice(["x86_64", "aarch64"]),
              help="Only this architecture (repeatable; default: both).")
@click.option("--json", "as_json", is_flag=True, help="Print the URLs as JSON.")
@inventory_options
def urls(inventory: str, limit, hosts, only_os, arches, as_json: bool, group_data, data) -> None:
    """Every outside URL a run over INVENTORY will use, without connecting to anything: the GPU stack's apt
    repositories, packages and keys, the images' registries, the hub or the checkpoint mirror, pip's index;
    and the origins (scheme://host:port) a firewall must let through."""
    from modelfleet.mirror import known_systems, origins, outside_urls

    unknown = [name for name in only_os if name not in known_systems()]
    if unknown:
        raise click.UsageError(f"--os {', '.join(unknown)}: not a release the GPU stack installs on (known: "
                               f"{', '.join(known_systems())})")
    result = _resolved_or_exit(inventory, group_data, data)
    entries = outside_urls(result, _selected(result, limit, hosts), tuple(only_os), tuple(arches))
    lines = []
    for e in entries:
        e["url"] = masking.url(e["url"])
        where = f"; on {', '.join(e['os'])}" if e["os"] else ""
        lines.append(f"{e['url'] or '(no URL: ' + e['used_by'] + ')'}\n    {e['kind']}: {'; '.join(e['what'])}\n"
                     f"    used by {e['used_by']}: {', '.join(e['hosts'])}{where}")
    allowed = origins(entries)
    lines.append("origins to allow: " + (", ".join(allowed) or "none"))
    lines.append("note: a registry may send clients on to its token service and blob storage, and the hub to "
                 "its file storage; those hosts are named only when asked")
    _emit({"urls": entries, "origins": allowed}, as_json, "\n".join(lines))


@main.group()
def lab() -> None:
    """The local rehearsal fleet (systemd + sshd containers on 127.0.1.N, a registry, engine doubles); from a
    checkout of modelfleet only (the lab/ folder is not part of the installed package)."""


def _lab_module():
    """The checkout's lab/ package: found from the working directory (the repository root)."""
    import importlib
    from pathlib import Path

    if not (Path.cwd() / "lab" / "__init__.py").exists():
        raise click.ClickException("`modelfleet lab` runs from the root of a modelfleet checkout (its lab/ folder "
                                   "is not part of the installed package)")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    return importlib.import_module("lab")


@lab.command("up")
@click.option("--hosts", type=click.IntRange(min=1, max=64), default=3, show_default=True, help="How many lab hosts.")
@click.option("--persona", "personas", multiple=True,
              help="GPU persona per host, repeated round-robin (default h200x1; `modelfleet lab personas` lists "
                   "them); *-bare hosts have no driver, Docker or toolkit yet (deploys/gpu_stack.py installs them).")
@click.option("--disks", type=click.IntRange(min=0, max=16), default=0, show_default=True,
              help="Loop devices per new host, standing in for NVMe drives (512 MiB sparse images).")
def lab_up(hosts: int, personas: tuple[str, ...], disks: int) -> None:
    """Start HOSTS lab hosts (idempotent: running ones are kept)."""
    labmod = _lab_module()
    unknown = sorted(set(personas) - set(labmod.PERSONAS))
    if unknown:
        raise click.UsageError(f"unknown persona {', '.join(unknown)} (personas: {', '.join(labmod.PERSONAS)})")
    specs = labmod.up(hosts, list(personas) or None, disks)
    click.echo(json.dumps([{k: s[k] for k in ("name", "address", "persona", "engine", "disks")} for s in specs],
                          indent=2))


@lab.command("personas")
def lab_personas() -> None:
    """Every persona a lab host can take (hardware, GPUs, bare or pre-built, the fault it carries), as JSON."""
    labmod = _lab_module()
    click.echo(json.dumps({name: {"hardware": hw, "gpus": gpus, "bare": bare,
                                  "fault_of": labmod.FAULTS.get(name, {}).get("base")}
                           for name, (hw, gpus, _, bare) in labmod.PERSONAS.items()}, indent=2))


@lab.command("down")
def lab_down() -> None:
    """Remove every lab host, its engine containers and the registry process."""
    labmod = _lab_module()
    click.echo(json.dumps(labmod.down()))


@lab.command("status")
def lab_status() -> None:
    """Lab hosts, their containers and SSH reachability, as JSON."""
    labmod = _lab_module()
    click.echo(json.dumps(labmod.status(), indent=2))


if __name__ == "__main__":
    main()
