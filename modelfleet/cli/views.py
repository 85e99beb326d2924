"""What the inventory says, read on the control node only: validate, plan, render, show, catalog, urls."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import click

from modelfleet.base import image_runtime, masking
from modelfleet.base.errors import ModelfleetError
from modelfleet.cli.common import (
    emit,
    inventory_options,
    limit_option,
    main,
    open_checked,
    resolved_or_exit,
    selected,
    shipped_catalog,
)
from modelfleet.plan import engine_flags, render, replica_door, weight_cache
from modelfleet.plan.inventory import COMMIT_RE, endpoints
from modelfleet.plan.inventory.schema import HostData
from modelfleet.plan.planner import layer_lines, plan_capacity, split_lines
from modelfleet.plan.router import preview as door_preview
from modelfleet.plan.router import summary as door_summary


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
    result = open_checked(inventory, group_data, data, offline)
    refused = result.errors + (result.warnings if strict else [])

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
    emit(out, as_json, "\n".join(lines))
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
@click.option("--host-ram-gib", type=click.IntRange(min=1, max=65536),
              help="Host RAM for recipes that keep MoE experts in RAM (default: the hardware catalog's figure).")
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
        result = resolved_or_exit(inventory, group_data, data)
        if host not in result.hosts:
            raise click.UsageError(f"no host {host!r} in {inventory} (hosts: {', '.join(result.hosts)})")
        target = result.hosts[host]
        reports = [(svc.recipe, plan_capacity(svc.model, svc.hardware, svc.gpus, svc.nnodes, recipe=svc.recipe,
                                              keep_revisions=target.model_keep_revisions,
                                              host_ram_gib=target.host_ram_gib, weight_cache=svc.weight_cache),
                    layer_lines_of(svc)) for svc in target.services]
        emit([{**r.to_json(), "recipe": recipe.id if recipe else None, "layer_offload": layered}
              for recipe, r, layered in reports], as_json,
             "\n\n".join(_plan_text(r, recipe, layered) for recipe, r, layered in reports)
             or f"{host} serves no model (router_only): nothing to size")
        sys.exit(0 if all(r.fits for _, r, _ in reports) else 1)
    if not (model and hardware and gpus):
        raise click.UsageError("give INVENTORY HOST, or --model, --hardware and --gpus")
    cat = shipped_catalog()
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
        quants = sorted({r.gguf_quant for r in recipes if r.gguf_quant})
        recipes = [r for r in recipes if r.gguf_quant == quant]
        if not recipes:
            raise click.UsageError(f"no recipe of {model} on {hardware} with GGUF quantization {quant!r}; its "
                                   f"quantizations there: {', '.join(quants) or 'none'} (`modelfleet catalog` "
                                   "lists every recipe)")
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
    layered = layer_lines(report, cat.models[model], cat.hardware[hardware], recipe)
    emit({**report.to_json(), "recipe": recipe.id if recipe else None, "layer_offload": layered}, as_json,
         _plan_text(report, recipe, layered))
    sys.exit(0 if report.fits else 1)


def layer_lines_of(svc) -> list[str]:
    report = plan_capacity(svc.model, svc.hardware, svc.gpus, svc.nnodes, recipe=svc.recipe)
    return layer_lines(report, svc.model, svc.hardware, svc.recipe)


def _plan_text(report, recipe, layered: list[str]) -> str:
    lines = [
        f"{report.model} on {report.nodes}x{report.gpus_per_node} {report.hardware}"
        + (f" (recipe {recipe.id})" if recipe else ""),
        "raw parameter bytes: " + ", ".join(f"{k} {v / 1e12:.2f} TB" for k, v in report.raw_bytes.items()),
        f"checkpoint: {report.checkpoint_bytes / 1e12:.3f} TB" + (" (estimated)" if report.checkpoint_estimated
                                                                  else ""),
        f"weights per GPU: {report.weights_per_gpu_bytes / 1e9:.1f} GB of "
        f"{report.usable_per_gpu_bytes / 1e9:.1f} GB usable; KV-cache room {report.kv_room_per_gpu_bytes / 1e9:.1f} GB",
        *split_lines(report), *layered,
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
    # units and pins load the registry and checkpoint clients (urllib): only render needs them
    from modelfleet.host import units
    from modelfleet.plan.pins import pinned_service

    result = resolved_or_exit(inventory, group_data, data)
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
        notes += _service_notes(plan, svc, pin)
        svc = _with_expected_fabric(result, svc, notes)
        if weight_cache.spec(svc):  # the restart tier beside it (docs/restart-tier.md)
            notes.append(f"weight cache {weight_cache.unit_name(svc)}: keeps the loaded weights across engine "
                         "restarts; only a change of its key (in its unit file) restarts it")
        files += [{"path": path, "mode": mode, "content": content}
                  for path, content, mode, _ in units.unit_files(svc, mask=True)]  # the run's one rendering path
        if svc.door_address and not svc.node_rank:  # the keyed proxy the run puts before the engine
            files += replica_door.preview(svc)
            why = (f"a replica behind the front door on {svc.router.host}: its engine leaves model routes open "
                   "without its key" if svc.router else f"{svc.engine_name} holds no key")
            notes.append(f"pool {svc.pool}: {why}: it listens on 127.0.0.1:{svc.port}, a keyed proxy "
                         f"({replica_door.unit_name(svc)}) on {replica_door.listen(svc)}")
    for rp in plan.routers:  # the front doors this host runs (modelfleet.plan.router)
        door_files, door_notes = door_preview(rp)
        files, notes = files + door_files, notes + door_notes
    files, notes = masking.masked(files), masking.masked(notes)
    if as_json:
        click.echo(json.dumps({"host": host, "files": files, "notes": notes}, indent=2))
        return
    click.echo("\n".join(f"# {note}" for note in notes))
    for f in files:
        click.echo(f"# ==> {f['path']}" + (f" ({f['mode']})" if f["mode"] == "0600" else ""))
        click.echo(f["content"])


def _venv_notes(svc, notes: list[str]) -> list[str]:
    fraction = svc.engine.memory_fraction_flag or "planning only"
    return [f"recipe {svc.recipe.id} ({'verified' if svc.recipe.verified else 'not verified'} by modelfleet; "
            f"source: {svc.recipe.source})", *notes,
            f"memory fraction: {svc.recipe.memory_fraction} ({fraction}); clients call it: "
            f"{', '.join(render.served_names(svc))}; GPUs: {', '.join(map(str, svc.gpu_indices)) or 'none'}"]


def _service_notes(plan, svc, pin: bool) -> list[str]:
    """What `render` says above a service's files: pins, the recipe and its flag check, the image's runtime, the
    memory fraction, names and GPUs, and what the run fills in on the host."""
    notes: list[str] = []
    if svc.venv:
        return _venv_notes(svc, render.venv_notes(svc))
    if not pin and ("@sha256:" not in svc.image or not COMMIT_RE.match(svc.revision or "")):
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
    return notes


def _with_expected_fabric(result, svc, notes: list[str]):
    """A pool across hosts: the fabric the run would derive for this member from what the inventory and the
    catalog say (the facts decide at run time), with the reason for each value."""
    if svc.nnodes == 1:
        return svc
    # the fabric's derivation (the facts' parsers, about 10 ms to import) is needed for a pool across hosts only
    from modelfleet.host import fabric

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
    result = open_checked(inventory, group_data, data)
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
    found = endpoints.rows(result, host)  # the front doors it runs, the services it serves
    rows += [{"key": f"endpoint: {e['endpoint']}", "value": e, "from": "the resolved plan"} for e in found]
    emit(rows, as_json, text + "".join(f"\nendpoint: {line}" for line in endpoints.lines(found)))
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
    cat = shipped_catalog()
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
    emit(out, as_json, "\n".join(lines))


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
    # urls asks the stages themselves (50 more modules, urllib.request among them): only this command needs them
    from modelfleet.fleet.urls import known_systems, origins, outside_urls

    unknown = [name for name in only_os if name not in known_systems()]
    if unknown:
        raise click.UsageError(f"--os {', '.join(unknown)}: not a release the GPU stack installs on (known: "
                               f"{', '.join(known_systems())})")
    result = resolved_or_exit(inventory, group_data, data)
    entries = outside_urls(result, selected(result, limit, hosts), tuple(only_os), tuple(arches))
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
    emit({"urls": entries, "origins": allowed}, as_json, "\n".join(lines))
