"""The one door: every consumer of an inventory (validate, render, plan, show, status, verify, bench, upgrade,
admit, converge, and the pyinfra run itself) resolves it here, with the same catalog (shipped + the site's
`recipes/` beside the inventory) and the same data by pyinfra's own rules (its group_data folders,
`--group-data`, `--data` and precedence). What the preview shows is what the run does.

Inside `pyinfra INVENTORY DEPLOY`, `guard()` (the checkout's `config.py`, which pyinfra runs before it loads the
inventory) resolves the inventory exactly as the run will and stops with exit 2 before any connection.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import click

from modelfleet.base import grammar, masking
from modelfleet.base.loader import LOADING, InventoryFileError, read_inventory
from modelfleet.plan.catalog import YAML_SUFFIXES, CatalogError, load_catalog, with_site_hardware, with_site_recipes
from modelfleet.plan.inventory.plan import Resolved
from modelfleet.plan.inventory.resolver import resolve
from modelfleet.plan.inventory.schema import SERVICE_KEYS, HostData

# Invocations already validated (refuse_invalid then does nothing), each with its resolution: the run's own where
# pyinfra merged the same host data (resolved once per run); else the run resolves pyinfra's merged data with the
# guard's record of where each value came from, so a fleet-wide value (--data, group_data/all.py) is judged there
# as validate judged it.
_guarded: dict[tuple, Resolved] = {}


def _key(run: dict[str, Any]) -> tuple:
    return (run["inventory"], run["cwd"], run["group_data"], tuple(sorted(map(str, run["data"].items()))))


def parse_value(text: str) -> Any:
    """A `--data key=value` value as pyinfra reads it (pyinfra_cli.util.parse_cli_arg: booleans, integers,
    JSON, else the string); a test holds the two equal."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_data(pairs: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """`--data key=value` options, as pyinfra merges them over every host's data."""
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"--data {pair!r}: expected key=value")
        key, value = pair.split("=", 1)
        out[key] = parse_value(value)
    return out


def site_recipes(inventory: str) -> Path:
    """A site's own recipes: YAML files in the `recipes/` folder beside the inventory file."""
    return Path(inventory).resolve().parent / "recipes"


def site_hardware(inventory: str) -> Path:
    """A site's own boards: YAML files in the `hardware/` folder beside the inventory file."""
    return Path(inventory).resolve().parent / "hardware"


def catalog_for(inventory: str | None):
    """The shipped catalog plus the site's boards, then its recipes (a site recipe may name a site board)."""
    catalog = load_catalog()
    for folder in (site_hardware(inventory), site_recipes(inventory)) if inventory else ():
        if folder.exists() and not folder.is_dir():
            raise CatalogError(str(folder), f"is not a folder: a site's {folder.name} are YAML files in a "
                                            f"{folder.name}/ folder beside the inventory")
    if inventory and site_hardware(inventory).is_dir():
        catalog = with_site_hardware(catalog, site_hardware(inventory))
    if inventory and site_recipes(inventory).is_dir():
        catalog = with_site_recipes(catalog, site_recipes(inventory))
    return catalog


def open_inventory(inventory: str, *, cwd: str | None = None, group_data: tuple[str, ...] = (),
                   data: dict[str, Any] | None = None, offline: bool = False) -> Resolved:
    """Load INVENTORY as `pyinfra INVENTORY ...` started in `cwd` (default: here) with these `--group-data`
    folders and `--data` overrides would, and resolve it. Never raises for bad input: a file that cannot be
    read (inventory, group_data, catalog, site recipe) is one error naming it and its line. `offline`: the
    control node's secrets are not looked at (reported as skipped), nothing else relaxed."""
    files: list[str] = []
    try:
        loaded = read_inventory(inventory, cwd=cwd, group_data=tuple(group_data), override_data=data)
        files = loaded.files
        catalog = catalog_for(inventory)
        result = resolve(loaded.entries, catalog, offline=offline, sources=loaded.sources)
        result.errors = loaded.problems + result.errors
        result.errors += module_settings(inventory, loaded.module_values)
    except (InventoryFileError, CatalogError) as error:
        result = Resolved(hosts={}, pools={}, errors=[(error.where, "file", error.message)])
        loaded = None
    if loaded:
        looked = ", ".join(files) if files else "none in " + ", ".join(loaded.folders)
        result.errors = [(w, f, f"{m} (not in the inventory file, --data or group_data; group_data read: "
                                f"{looked})" if m == "missing" else m) for w, f, m in result.errors]
    # Names and keys from any door (a host name, a --data key) reach report lines: escaped, never a new line.
    for kind in ("errors", "warnings", "info"):
        setattr(result, kind, [tuple(grammar.printable(str(part)) for part in problem)
                               for problem in getattr(result, kind)])
    result.group_data_files = files
    result.groups = loaded.groups if loaded else {}
    result.data = dict(loaded.entries) if loaded else {}
    result.group_data_folders = loaded.folders if loaded else []
    result.sources = loaded.sources if loaded else {}
    recipes, boards = site_recipes(inventory), site_hardware(inventory)
    result.site_recipe_files, result.site_hardware_files = _yaml_listed(recipes), _yaml_listed(boards)
    return result


def _yaml_listed(folder: Path) -> list[str]:
    """The YAML files of a site folder, as the catalog reads them (one that is not a file was an error)."""
    return sorted(str(p) for p in folder.iterdir() if p.suffix.lower() in YAML_SUFFIXES and p.is_file()) \
        if folder.is_dir() else []


def module_settings(inventory: str, values: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Settings written at the inventory file's top level: pyinfra reads only groups there, so they would be
    ignored without a word."""
    known = set(HostData.model_fields) | set(SERVICE_KEYS)
    return [(inventory, key, "set at module level, where pyinfra reads only groups (it would be ignored): put it "
                             "in group_data/all.py, a group's data or the hosts' data")
            for key in values if key in known]


def invocation() -> dict[str, Any] | None:
    """How the running `pyinfra` command was started (inventory, working directory, --group-data, --data and
    its ssh_* options), read from pyinfra's own command-line context; None outside pyinfra's CLI."""
    context = click.get_current_context(silent=True)
    if context is not None and {"inventory", "operations"} <= set(context.params):
        params = context.params
    elif getattr(sys.modules.get("pyinfra"), "is_cli", False) and "pyinfra_cli.cli" in sys.modules:
        # Deploy files run in greenlets, where click's context (greenlet-local under gevent) is not set:
        # parse the command line again with pyinfra's own command, callbacks off.
        params = sys.modules["pyinfra_cli.cli"].cli.make_context("pyinfra", sys.argv[1:],
                                                                 resilient_parsing=True).params
    else:
        return None
    data = parse_data(params.get("data") or ())
    for key in ("ssh_user", "ssh_key", "ssh_key_password", "ssh_port", "ssh_password"):
        if params.get(key):
            data[key] = params[key]
    return {"inventory": params["inventory"], "cwd": os.getcwd(), "group_data": tuple(params.get("group_data") or ()),
            "data": data}


def for_run(entries: list[tuple[str, dict[str, Any]]]) -> Resolved:
    """The pyinfra run's resolution: pyinfra's own merged host data (its group_data, --group-data and --data
    rules, applied by pyinfra), with the catalog of the inventory the run was started with."""
    run = invocation()
    inventory = run["inventory"] if run and Path(run["inventory"]).is_file() else None
    guarded = _guarded.get(_key(run)) if run else None
    if guarded is not None and guarded.data == dict(entries):
        result = guarded
    else:
        result = resolve(entries, catalog_for(inventory), sources=guarded.sources if guarded else None)
    for _, data in entries:
        masking.learn_data(data if isinstance(data, dict) else {})
    masking.learn_inventory(result)  # pyinfra's output from here on (operation names, command output) masked
    masking.install()
    return result


def guard() -> None:
    """Refuse a `pyinfra INVENTORY ...` run whose inventory does not resolve, before pyinfra loads it or
    connects anywhere: every error printed, grouped by host, exit 2. Call it from `config.py` beside where
    pyinfra runs (the checkout has one); a run that is not a file inventory (`pyinfra @local ...`, a host list)
    passes untouched."""
    run = invocation()
    if run is None or not Path(run["inventory"]).is_file():
        return
    masking.install()  # from here on, pyinfra's output is masked (its errors, operation names, command output)
    key = _key(run)
    if key in _guarded:
        return
    result = open_inventory(run["inventory"], cwd=run["cwd"], group_data=run["group_data"], data=run["data"])
    masking.learn_inventory(result)
    if result.errors:
        print(f"modelfleet: {run['inventory']} is not valid; nothing was touched:\n{result.error_report()}",
              file=sys.stderr)
        raise SystemExit(2)
    _guarded[key] = result


def guarded() -> bool:
    """Whether guard() already validated the running pyinfra command's inventory."""
    run = invocation()
    return bool(run) and any(k[0] == run["inventory"] for k in _guarded)


def limit(result: Resolved, patterns: tuple[str, ...] | list[str]) -> list[str]:
    """The hosts `pyinfra --limit PATTERN ...` would pick: a group's hosts, else the host names matching the
    glob, in inventory order; a pattern matching nothing is an error (pyinfra only warns, and would act on
    none)."""
    if not patterns:
        return list(result.hosts)
    chosen: set[str] = set()
    for pattern in patterns:
        found = result.groups.get(pattern) or [name for name in result.hosts if fnmatch(name, pattern)]
        if not found:
            raise ValueError(f"--limit {pattern}: no host or group matches (groups: "
                             f"{', '.join(sorted(result.groups))})")
        chosen.update(found)
    return [name for name in result.hosts if name in chosen]


def whole(result: Resolved, names: list[str], checkpoint_groups: bool = True) -> Resolved:
    """The inventory cut down to `names` and every host that shares a pool with one of them (a pool is converged,
    gated and upgraded as one) or, with `checkpoint_groups`, a checkpoint group (a converge copies from the
    group's first host; an upgrade prefetches batch by batch from whichever peer holds the revision)."""
    keep = set(names)
    grown = True
    while grown:
        grown = False
        for name, plan in result.hosts.items():
            if name in keep:
                continue
            if any(svc.pool in result.pools and set(result.pools[svc.pool].hosts) & keep or
                   checkpoint_groups and any(svc.checkpoint_group == s.checkpoint_group
                                             for k in keep for s in result.hosts[k].services)
                   for svc in plan.services):
                keep.add(name)
                grown = True
    hosts = {n: p for n, p in result.hosts.items() if n in keep}
    pools = {n: p for n, p in result.pools.items() if set(p.hosts) & keep}
    return replace(result, hosts=hosts, pools=pools)


def resolve_inventory(path: str, **options) -> Resolved:
    """`open_inventory` (the one door), under the name older callers import."""
    return open_inventory(path, **options)


def refuse_invalid(inventory_file: str) -> None:
    """
    `refuse_invalid(__file__)` at the end of an inventory file: when pyinfra loads the file, the whole
    inventory is validated through the door, as this pyinfra command will run it (its --group-data and --data),
    before pyinfra connects to any host; any error is printed, grouped by host, and pyinfra exits with status 2.
    The checkout's `config.py` does the same for every inventory (`guard`); when that already ran, or
    when modelfleet itself reads the inventory (validate, render, status...), this does nothing.
    """
    if LOADING.get() or guarded():
        return
    run = invocation() or {}
    options = {k: run[k] for k in ("cwd", "group_data", "data") if k in run}
    result = open_inventory(inventory_file, **options)
    if run:  # inside pyinfra: its output from here on is masked
        masking.learn_inventory(result)
        masking.install()
    if result.errors:
        print(f"modelfleet: {inventory_file} is not valid; nothing was touched:\n{result.error_report()}",
              file=sys.stderr)
        raise SystemExit(2)
    if run:
        _guarded[_key(run)] = result
