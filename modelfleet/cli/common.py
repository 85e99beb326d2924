"""The `modelfleet` command group and what its commands share: the inventory's options as pyinfra spells them,
opening the inventory (usage errors exit 2), the shipped catalog, and one masked way to print."""

from __future__ import annotations

import json
import sys

import click

from modelfleet.base import masking, runscope
from modelfleet.plan.catalog import CatalogError, load_catalog
from modelfleet.plan.inventory import open_inventory
from modelfleet.plan.inventory.door import limit as pick
from modelfleet.plan.inventory.door import parse_data


def emit(data, as_json: bool, text: str) -> None:
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


def selected(result, limit=(), hosts=()) -> list[str]:
    try:
        return pick(result, tuple(limit) + tuple(hosts))
    except ValueError as error:
        raise click.UsageError(str(error)) from None


def open_checked(inventory: str, group_data=(), data=(), offline: bool = False):
    try:
        overrides = parse_data(data)
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    result = open_inventory(inventory, group_data=tuple(group_data), data=overrides, offline=offline)
    masking.learn_inventory(result)  # whatever prints next (a row, a unit, an exception) masks them
    return result


def shipped_catalog():
    """The shipped catalog, or one line naming its broken file and field (exit 2)."""
    try:
        return load_catalog()
    except CatalogError as error:
        click.echo(f"modelfleet: the catalog is broken: {error}", err=True)
        sys.exit(2)


def resolved_or_exit(inventory: str, group_data=(), data=()):
    """The inventory resolved, or its problems on stderr (exit 2)."""
    result = open_checked(inventory, group_data, data)
    if result.errors:
        click.echo(result.error_report(), err=True)
        sys.exit(2)
    return result


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option()
@click.pass_context
def main(ctx: click.Context) -> None:
    """Turn GPU servers into serving nodes for open-weight models (pyinfra stages + checks)."""
    ctx.with_resource(runscope.scope())  # a command resolves each digest and checkpoint once, like a run
    ctx.with_resource(masking.streams())  # every line a command prints goes through the one mask
