"""Read a pyinfra inventory file and its group_data/ as pyinfra's CLI does, without importing pyinfra's CLI.

`pyinfra_cli` monkey-patches the whole process with gevent when imported; the control commands (validate,
render, status, verify, bench, upgrade...) must not carry that patching (it breaks trio-based clients and
invoke's runner), so they read inventories here. The semantics are pyinfra's, documented at
https://docs.pyinfra.com/en/3.x/inventory-data.html and held equal to pyinfra_cli's own loader by a test: every
module-level list (or `(hosts, data)` tuple) whose name does not start with `_` is a group; `group_data/<group>.py`
beside the working directory, beside the inventory file and in every `--group-data` folder holds each group's
data (`all.py` for every host); the data precedence (`--data` > host > group > all) is pyinfra's own `Inventory`'s.

A file that does not run (syntax error, exception, a host that is not a name or `(name, dict)`) is reported
as one error naming the file and line, never a traceback.
"""

from __future__ import annotations

import ast
import contextvars
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelfleet.base.errors import ModelfleetError

LOADING = contextvars.ContextVar("modelfleet_loading_inventory", default=False)


class InventoryFileError(ModelfleetError):
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
    except UnicodeDecodeError:
        raise InventoryFileError(str(path), "is not UTF-8 text") from None
    _duplicate_keys(path)
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


def _duplicate_keys(path: Path) -> None:
    """A dict literal that writes one key twice keeps the last without a word (a host's `port` given twice):
    refused at the second, as a site YAML file's is."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Dict):
            continue
        seen: dict[Any, int] = {}
        for key in node.keys:
            if isinstance(key, ast.Constant) and isinstance(key.value, (str, int)):
                if key.value in seen:
                    raise InventoryFileError(f"{path}:{key.lineno}", f"key {key.value!r} is written twice in one "
                                             f"dict (first on line {seen[key.value]}): Python would keep the last "
                                             "without a word")
                seen[key.value] = key.lineno


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


def _group_data(folders: list[Path]) -> tuple[dict[str, dict[str, Any]], dict[tuple[str, str], str], list[str]]:
    """Each group's data from the folders, in pyinfra's order (a later folder's file wins), the file that gave
    each (group, key), and the files read."""
    out: dict[str, dict[str, Any]] = {}
    given_by: dict[tuple[str, str], str] = {}
    read: list[str] = []
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.py")):
            attrs = _run_file(path)
            path = _shown(path)
            read.append(str(path))
            keys = attrs["__all__"] if "__all__" in attrs else [k for k in attrs if k not in _imported_names(path)]
            data = {k: v for k, v in attrs.items() if k in keys and not k.startswith("__")}
            out.setdefault(path.stem, {}).update(data)
            given_by.update({(path.stem, k): str(path) for k in data})
    return out, given_by, read


def _shown(path: Path) -> Path:
    """A path as the user would write it: relative to the working directory when under it."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def group_data_folders(inventory_file: str, cwd: str, extra: tuple[str, ...] = ()) -> list[Path]:
    """Where pyinfra looks for group_data, in its order: beside the working directory, beside the inventory
    file (when that is another directory), then every `--group-data` folder."""
    folders = [Path(cwd) / "group_data"]
    if str(Path(inventory_file).parent.resolve()) != cwd:
        folders.append(Path(inventory_file).parent.resolve() / "group_data")
    return folders + [Path(folder) for folder in extra]


@dataclass
class Loaded:
    """An inventory as pyinfra would load it: each host's merged data, where each value came from, and the
    group_data files read."""

    entries: list[tuple[str, dict[str, Any]]]
    sources: dict[str, dict[str, str]] = field(default_factory=dict)  # host -> key -> file or "--data"
    files: list[str] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)
    groups: dict[str, list[str]] = field(default_factory=dict)  # pyinfra's groups (the file's name one included)
    module_values: dict[str, Any] = field(default_factory=dict)  # plain values at the file's top level
    # (where, field, message): refused, but the data still loads as pyinfra merges it (`show` prints it)
    problems: list[tuple[str, str, str]] = field(default_factory=list)


def _groups(inventory_file: Path) -> tuple[dict[str, tuple[list, dict]], dict[str, Any], list]:
    """The file's groups as pyinfra reads them (name -> (hosts, group data)), its other top-level values, and
    what is refused though it loads (a host given data in two groups). A group named `all` or a host listed
    twice in a group cannot be read as meant: an error naming the file."""
    groups: dict[str, tuple[list, dict]] = {}
    data_from: dict[str, str] = {}  # host -> the group whose entry gave it data
    module_values: dict[str, Any] = {}
    problems = []
    for key, value in _run_file(inventory_file).items():
        if key.startswith("_"):
            continue
        hosts = _host_entries(key, value, inventory_file)
        if hosts is None:
            if isinstance(value, (str, int, float, bool, dict)):
                module_values[key] = value  # pyinfra ignores it; the door names it when it is a setting
            continue
        if key == "all":
            raise InventoryFileError(str(inventory_file), "group all: `all` is pyinfra's name for every host; a "
                                     "group of that name becomes the whole host list and drops the hosts of the "
                                     "other groups: rename it")
        names_here = [h[0] if isinstance(h, tuple) else h for h in hosts]
        twice = sorted({n for n in names_here if names_here.count(n) > 1})
        if twice:
            raise InventoryFileError(str(inventory_file), f"group {key}: host {twice[0]} is listed twice")
        for entry in hosts:
            if isinstance(entry, tuple) and entry[1]:
                if entry[0] in data_from:  # pyinfra would merge both silently
                    problems.append((str(inventory_file), "file", f"host {entry[0]} has data in groups "
                                     f"{data_from[entry[0]]} and {key}: give it in one place"))
                data_from[entry[0]] = key
        data = value[1] if isinstance(value, tuple) else {}
        groups[key] = (hosts, dict(data))
    return groups, module_values, problems


def read_inventory(path: str, cwd: str | None = None, group_data: tuple[str, ...] = (),
                   override_data: dict[str, Any] | None = None) -> Loaded:
    """Every host of the inventory file with its merged data, in file order, by pyinfra's rules: group_data
    folders (`group_data_folders`), `--data` overrides (`override_data`) above host data above group data."""
    from pyinfra.api import Inventory  # the API only: no gevent patching

    cwd = str(Path(cwd or Path.cwd()).resolve())
    inventory_file = Path(path)
    if not inventory_file.is_file():
        raise InventoryFileError(path, "no such inventory file")
    groups, module_values, problems = _groups(inventory_file)
    given_by = {(group, k): str(inventory_file) for group, (_, data) in groups.items() for k in data}
    all_hosts, all_data = groups.pop("all", ([], {}))
    names = [h[0] if isinstance(h, tuple) else h for h in all_hosts]
    for hosts, _ in groups.values():
        names += [n for n in (h[0] if isinstance(h, tuple) else h for h in hosts) if n not in names]
    groups.setdefault(inventory_file.stem, (list(names), {}))
    folders = group_data_folders(path, cwd, tuple(group_data))
    extra, from_files, read = _group_data(folders)
    given_by.update(from_files)
    all_data = {**all_data, **extra.pop("all", {})}
    for group, data in extra.items():
        hosts, own = groups.get(group, ([], {}))
        groups[group] = (hosts, {**own, **data})
    problems += _group_conflicts(groups, override_data or {})
    loaded = Loaded(entries=[], files=read, folders=[str(_shown(f)) for f in folders], module_values=module_values,
                    problems=problems)
    if not names:
        return loaded
    override = dict(override_data or {})
    inventory = Inventory((all_hosts or names, all_data), override_data=override, **groups)
    loaded.groups = {name: [h.name for h in hosts] for name, hosts in inventory.groups.items()}
    for host in inventory:
        loaded.entries.append((host.name, host.data.dict()))
        loaded.sources[host.name] = _sources(inventory, host, override, given_by, str(inventory_file))
    return loaded



def _group_conflicts(groups: dict[str, tuple[list, dict]], override: dict[str, Any]) -> list[tuple[str, str, str]]:
    """A host in two groups whose data (the group's tuple or its group_data file) give one key different
    values: pyinfra takes one of them without a word (a model switched, two front doors on one port). Refused,
    naming both groups, unless the host's own data or `--data` settles the key."""
    own: dict[str, dict] = {}
    member: dict[str, list[str]] = {}
    for group, (hosts, _) in groups.items():
        for entry in hosts:
            name = entry[0] if isinstance(entry, tuple) else entry
            member.setdefault(name, []).append(group)
            if isinstance(entry, tuple):
                own.setdefault(name, {}).update(entry[1])
    out = []
    for name, names in member.items():
        first: dict[str, tuple[str, Any]] = {}
        for group in names:
            for key, value in groups[group][1].items():
                if key in own.get(name, {}) or key in override:
                    continue
                seen = first.setdefault(key, (group, value))
                if seen[0] != group and seen[1] != value:
                    out.append((f"host {name}", key, f"groups {seen[0]} and {group} give it different values and "
                                                     "the host is in both: pyinfra would take one without a word; "
                                                     "set it in the host's own data, or keep the host in one group"))
    return out


def _sources(inventory, host, override: dict[str, Any], given_by: dict[tuple[str, str], str],
             inventory_file: str) -> dict[str, str]:
    """Where each key of the host's merged data came from: `--data`, the inventory file, or the file of the
    group (or group_data) that gave it."""
    own = inventory.get_host_data(host.name)
    sources = {}
    for key in host.data.dict():
        if key in override:
            sources[key] = "--data"
        elif key in own:
            sources[key] = inventory_file
        else:
            group = next((g for g in reversed(host.groups) if key in inventory.get_group_data(g)), "all")
            sources[key] = given_by.get((group, key), inventory_file)
    return sources
