"""Read a pyinfra inventory file and its group_data/ as pyinfra's CLI does, without importing pyinfra's CLI.

`pyinfra_cli` monkey-patches the whole process with gevent when imported; the control commands (validate,
render, status, verify, bench, upgrade...) must not carry that patching (it breaks trio-based clients and
invoke's runner), so they read inventories here. The semantics are pyinfra's, documented at
https://docs.pyinfra.com/en/3.x/inventory-data.html: every module-level list (or `(hosts, data)` tuple) whose
name does not start with `_` is a group; `group_data/<group>.py` beside the working directory and beside the
inventory file holds each group's data (`all.py` for every host); the data precedence (host > group > all) is
pyinfra's own `Inventory`'s.

A file that does not run (syntax error, exception, a host that is not a name or `(name, dict)`) is reported
as one error naming the file and line, never a traceback.
"""

from __future__ import annotations

import ast
import contextvars
import traceback
from pathlib import Path
from typing import Any

LOADING = contextvars.ContextVar("modelfleet_loading_inventory", default=False)


class InventoryFileError(Exception):
    """A file that could not be read as an inventory: `where` is `path:line`."""

    def __init__(self, where: str, message: str):
        self.where, self.message = where, message
        super().__init__(f"{where}: {message}")


def _run_file(path: Path) -> dict[str, Any]:
    """Execute one Python file like pyinfra's exec_file; errors become file:line messages."""
    try:
        code = compile(path.read_text(encoding="utf-8"), str(path), "exec")
    except SyntaxError as error:
        raise InventoryFileError(f"{path}:{error.lineno}", f"syntax error: {error.msg}") from None
    except OSError as error:
        raise InventoryFileError(str(path), f"cannot read: {error.strerror}") from None
    namespace: dict[str, Any] = {"__file__": str(path)}
    token = LOADING.set(True)
    try:
        exec(code, namespace)
    except SystemExit:
        raise
    except Exception as error:  # the user's code: report where it failed, not our stack
        frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == str(path)]
        line = frames[-1].lineno if frames else "?"
        raise InventoryFileError(f"{path}:{line}", f"{type(error).__name__}: {error}") from None
    finally:
        LOADING.reset(token)
    return namespace


def _imported_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def _host_entries(group: str, value: Any, path: Path) -> list | None:
    """A group's host entries, or None when the variable is not a group (pyinfra ignores it too)."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], list):
        value = value[0]
    if not isinstance(value, list):
        return None
    for entry in value:
        name = entry[0] if isinstance(entry, tuple) and entry else entry
        if not isinstance(name, str) or not name.strip():
            raise InventoryFileError(str(path), f"group {group}: host {entry!r} is neither a name nor (name, dict)")
        if isinstance(entry, tuple) and (len(entry) != 2 or not isinstance(entry[1], dict)):
            raise InventoryFileError(str(path), f"group {group}: host {name}: its data must be a dict, "
                                                f"got {type(entry[1]).__name__ if len(entry) > 1 else 'nothing'}")
    return value


def _group_data(folders: list[Path]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.py")):
            attrs = _run_file(path)
            keys = attrs["__all__"] if "__all__" in attrs else [k for k in attrs if k not in _imported_names(path)]
            out.setdefault(path.stem, {}).update(
                {k: v for k, v in attrs.items() if k in keys and not k.startswith("__")})
    return out


def read_inventory(path: str, cwd: str | None = None) -> list[tuple[str, dict[str, Any]]]:
    """(host name, merged data) for every host of the inventory file, in file order."""
    from pyinfra.api import Inventory  # the API only: no gevent patching

    inventory_file = Path(path)
    if not inventory_file.is_file():
        raise InventoryFileError(path, "no such inventory file")
    groups: dict[str, tuple[list, dict]] = {}
    data_from: dict[str, str] = {}  # host -> the group whose entry gave it data
    for key, value in _run_file(inventory_file).items():
        if key.startswith("_"):
            continue
        hosts = _host_entries(key, value, inventory_file)
        if hosts is None:
            continue
        names_here = [h[0] if isinstance(h, tuple) else h for h in hosts]
        twice = sorted({n for n in names_here if names_here.count(n) > 1})
        if twice:
            raise InventoryFileError(str(inventory_file), f"group {key}: host {twice[0]} is listed twice")
        for entry in hosts:
            if isinstance(entry, tuple) and entry[1]:
                if entry[0] in data_from:  # pyinfra would merge both silently
                    raise InventoryFileError(str(inventory_file), f"host {entry[0]} has data in groups "
                                             f"{data_from[entry[0]]} and {key}: give it in one place")
                data_from[entry[0]] = key
        data = value[1] if isinstance(value, tuple) else {}
        groups[key] = (hosts, dict(data))
    all_hosts, all_data = groups.pop("all", ([], {}))
    names = [h[0] if isinstance(h, tuple) else h for h in all_hosts]
    for hosts, _ in groups.values():
        names += [n for n in (h[0] if isinstance(h, tuple) else h for h in hosts) if n not in names]
    groups.setdefault(inventory_file.stem, (list(names), {}))
    folders = [Path(cwd or Path.cwd()) / "group_data"]
    if inventory_file.resolve().parent != Path(cwd or Path.cwd()).resolve():
        folders.append(inventory_file.resolve().parent / "group_data")
    extra = _group_data(folders)
    all_data = {**all_data, **extra.pop("all", {})}
    for group, data in extra.items():
        hosts, own = groups.get(group, ([], {}))
        groups[group] = (hosts, {**own, **data})
    if not names:
        return []
    inventory = Inventory((all_hosts or names, all_data), **groups)
    return [(host.name, host.data.dict()) for host in inventory]
