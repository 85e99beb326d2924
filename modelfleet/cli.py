"""modelfleet command line: validate, plan, render (and the lab)."""

from __future__ import annotations

import json
import sys

import click

from modelfleet import render
from modelfleet.catalog import load_catalog
from modelfleet.inventory import resolve_inventory
from modelfleet.planner import plan_capacity


def _emit(data, as_json: bool, text: str) -> None:
    click.echo(json.dumps(data, indent=2, default=str) if as_json else text)


@click.group()
@click.version_option()
def main() -> None:
    """Turn GPU servers into serving nodes for open-weight models (pyinfra stages + checks)."""


@main.command()
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def validate(inventory: str, as_json: bool) -> None:
    """Check INVENTORY against the catalog; report every problem at once (exit 2 if any)."""
    result = resolve_inventory(inventory)
    data = {"ok": not result.errors, "hosts": sorted(result.hosts), "pools": {
        name: {"hosts": pool.hosts, "recipe": pool.services[0].recipe.id} for name, pool in result.pools.items()},
        "errors": [{"where": w, "field": f, "message": m} for w, f, m in result.errors]}
    text = "\n".join(result.error_lines()) if result.errors else (
        f"ok: {len(result.hosts)} host(s), {len(result.pools)} pool(s)")
    _emit(data, as_json, text)
    sys.exit(2 if result.errors else 0)


@main.command()
@click.option("--model", required=True, help="Catalog model id, e.g. kimi-k3.1-pro.")
@click.option("--hardware", required=True, help="Catalog hardware id, e.g. b300.")
@click.option("--gpus", type=int, required=True, help="GPUs per node.")
@click.option("--nodes", type=int, default=1, show_default=True)
@click.option("--keep-revisions", type=int, default=1, show_default=True, help="Rollback copies kept on disk.")
@click.option("--json", "as_json", is_flag=True, help="Print the full plan as JSON.")
def plan(model: str, hardware: str, gpus: int, nodes: int, keep_revisions: int, as_json: bool) -> None:
    """Size MODEL on GPUS x HARDWARE (x NODES): weights per GPU, KV-cache room, disk. Exit 1 if it cannot work."""
    cat = load_catalog()
    for kind, value, table in (("model", model, cat.models), ("hardware", hardware, cat.hardware)):
        if value not in table:
            raise click.UsageError(f"unknown {kind} {value!r} (known: {', '.join(sorted(table))})")
    recipes = [r for r in cat.recipes.values() if r.model == model and hardware in r.hardware]
    report = plan_capacity(cat.models[model], cat.hardware[hardware], gpus, nodes,
                           recipe=recipes[0] if recipes else None, keep_revisions=keep_revisions)
    lines = [
        f"{report.model} on {nodes}x{gpus} {report.hardware}",
        "raw parameter bytes: " + ", ".join(f"{k} {v / 1e12:.2f} TB" for k, v in report.raw_bytes.items()),
        f"checkpoint: {report.checkpoint_bytes / 1e12:.3f} TB" + (" (estimated)" if report.checkpoint_estimated
                                                                  else ""),
        f"weights per GPU: {report.weights_per_gpu_bytes / 1e9:.1f} GB of "
        f"{report.usable_per_gpu_bytes / 1e9:.1f} GB usable; KV-cache room {report.kv_room_per_gpu_bytes / 1e9:.1f} GB",
        f"disk needed per host: {report.disk_needed_bytes / 1e12:.3f} TB", report.reason,
    ]
    _emit(report.to_json(), as_json, "\n".join(lines))
    sys.exit(0 if report.fits else 1)


@main.command("render")
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@click.argument("host")
def render_cmd(inventory: str, host: str) -> None:
    """Print HOST's systemd unit(s) and env file(s), secrets masked (images shown by tag, unpinned)."""
    result = resolve_inventory(inventory)
    if result.errors:
        click.echo("\n".join(result.error_lines()), err=True)
        sys.exit(2)
    if host not in result.hosts:
        raise click.UsageError(f"no host {host!r} in {inventory} (hosts: {', '.join(sorted(result.hosts))})")
    for svc in result.hosts[host].services:
        click.echo(f"# ==> /etc/systemd/system/{svc.unit_name}")
        click.echo(render.render_unit(svc))
        click.echo(f"# ==> {svc.env_file} (0600)")
        click.echo(render.render_env(svc, mask=True))
        secrets = render.render_secrets_config(svc, mask=True)
        if secrets:
            click.echo(f"# ==> {svc.secrets_config_file} (0600)\n{secrets}")


@main.group()
def lab() -> None:
    """The local rehearsal fleet (systemd + sshd containers on 127.0.1.N, a registry, engine doubles)."""


@lab.command("up")
@click.option("--hosts", type=int, default=3, show_default=True)
@click.option("--persona", "personas", multiple=True, type=click.Choice(["h200x1", "b300x8-synthetic"]),
              help="GPU persona per host, repeated round-robin (default h200x1).")
def lab_up(hosts: int, personas: tuple[str, ...]) -> None:
    """Start HOSTS lab hosts (idempotent: running ones are kept)."""
    from modelfleet import lab as labmod

    specs = labmod.up(hosts, list(personas) or None)
    click.echo(json.dumps([{k: s[k] for k in ("name", "address", "persona", "engine")} for s in specs], indent=2))


@lab.command("down")
def lab_down() -> None:
    """Remove every lab host, its engine containers and the registry process."""
    from modelfleet import lab as labmod

    click.echo(json.dumps(labmod.down()))


@lab.command("status")
def lab_status() -> None:
    """Lab hosts, their containers and SSH reachability, as JSON."""
    from modelfleet import lab as labmod

    click.echo(json.dumps(labmod.status(), indent=2))


if __name__ == "__main__":
    main()
