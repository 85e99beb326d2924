"""The package's layers are acyclic: no module imports, at import time, a module that imports it back (directly or
around a circle). A circle imports only by the order of lines, and reordering them breaks `import` of some module
far away; this test names the circle the day one appears.

The package's modules stand on floors, folders named for what they hold, each importing only from the floors
below it: base (what every floor uses), plan (what should be, from inventory and catalog; nothing connects), host
(what a host has and how it changes), run (one deploy run and its stages), fleet (the second day over many runs),
cli on top. Every import counts for the floors, those inside functions and under TYPE_CHECKING too: a name
imported from a higher floor belongs to a module below. No module lies loose beside the floors.

The graph for circles is the one Python runs: module-level imports (also inside top-level `if`/`try`), minus `if
TYPE_CHECKING:` blocks and imports inside functions (they run later, once every module is loaded). Importing `a.b.c`
runs `a` and `a.b` first, so it counts as importing those packages too. A package that loads names on first use (a
`_LATE` table of name -> submodule beside a PEP 562 `__getattr__`, as modelfleet.plan.inventory) loads that
submodule when a module imports the name: that counts as importing the submodule.
"""

import ast
from pathlib import Path

from modelfleet import PACKAGE_DIR


def _modules(root: Path) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _runs_at_import(tree: ast.Module):
    """The import statements a module runs when it is imported."""
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.If, ast.Try)):
            blocks = [node.body, node.orelse, *[h.body for h in getattr(node, "handlers", [])],
                      getattr(node, "finalbody", [])]
            yield from (n for block in blocks for n in block if isinstance(n, (ast.Import, ast.ImportFrom)))


def _late_names(path: Path) -> dict[str, str]:
    """A package's names loaded on first use: its `_LATE = {name: submodule}` table."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_LATE" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports at import time."""
    mods = _modules(root)
    late = {m: _late_names(p) for m, p in mods.items() if p.name == "__init__.py"}
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in _runs_at_import(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                named = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    here = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    here = here[: len(here) - (node.level - 1)]
                    base = ".".join(here + ([node.module] if node.module else []))
                named = [base] + [f"{base}.{a.name}" for a in node.names]
                named += [f"{base}.{late[base][a.name]}" for a in node.names if a.name in late.get(base, {})]
            for target in (t for t in named if t in mods and t != mod):
                edges[mod].add(target)
                parts = target.split(".")
                for i in range(1, len(parts)):
                    parent = ".".join(parts[:i])
                    if parent in mods and parent != mod and not mod.startswith(parent + "."):
                        edges[mod].add(parent)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The graph's circles: its strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp.append(member)
                    if member == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_package_has_no_import_cycle():
    edges = import_graph(PACKAGE_DIR)
    assert len(edges) > 80 and edges["modelfleet.plan.inventory.resolver"]  # the walk saw the package and its imports
    assert cycles(edges) == [], "import cycles (move what the lower module needs down, or import under TYPE_CHECKING)"


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root / "pkg"


def test_a_circle_through_a_package_init_is_found(tmp_path):
    # The shape the package had: a low module imports a plan type through the package, whose __init__ loads the
    # resolver, which imports the low module.
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low.py": "from pkg.inv import Plan\n",
        "pkg/inv/__init__.py": "from pkg.inv.plan import Plan\nfrom pkg.inv.resolver import resolve\n",
        "pkg/inv/plan.py": "class Plan: ...\n",
        "pkg/inv/resolver.py": "from .. import low\n",
    })
    assert cycles(import_graph(pkg)) == [["pkg.inv", "pkg.inv.resolver", "pkg.low"]]


def test_a_name_a_package_loads_on_first_use_counts_as_its_module(tmp_path):
    # The package's __init__ loads the resolver only when `resolve` is asked for; a module asking for it at import
    # time imports the resolver all the same, and the resolver importing that module back is a circle.
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low.py": "from pkg.inv import resolve\n",
        "pkg/inv/__init__.py": "from pkg.inv.plan import Plan\n_LATE = {'resolve': 'resolver'}\n"
                               "def __getattr__(name):\n    import importlib\n"
                               "    return getattr(importlib.import_module('pkg.inv.' + _LATE[name]), name)\n",
        "pkg/inv/plan.py": "class Plan: ...\n",
        "pkg/inv/resolver.py": "from pkg import low\n",
    })
    edges = import_graph(pkg)
    assert edges["pkg.inv"] == {"pkg.inv.plan"} and "pkg.inv.resolver" in edges["pkg.low"]
    assert cycles(edges) == [["pkg.inv.resolver", "pkg.low"]]
    (pkg / "low.py").write_text("from pkg.inv import Plan\n")  # a plan type loads no resolver: no circle
    assert cycles(import_graph(pkg)) == []


def test_imports_that_run_later_make_no_circle(tmp_path):
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from typing import TYPE_CHECKING\nimport pkg.b\nif TYPE_CHECKING:\n    from pkg import c\n",
        "pkg/b.py": "def f():\n    from pkg import a\n",
        "pkg/c.py": "import pkg.a\n",
    })
    edges = import_graph(pkg)
    assert edges["pkg.a"] == {"pkg.b"} and edges["pkg.c"] == {"pkg.a"}
    assert cycles(edges) == []


def test_every_import_inside_a_function_names_what_exists():
    """Imports inside functions run only when the function does: one naming a module or name that moved fails a
    command on a user's host long after the move (`modelfleet admit` did, once `deploy` left modelfleet.base.commands).
    Every `from modelfleet... import NAME`, wherever it stands, must resolve now."""
    import importlib

    broken = []
    for name, path in _modules(PACKAGE_DIR).items():
        if "files" in name.split("."):  # host-side programs, run by python3 alone on hosts
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and node.module.split(".")[0] == "modelfleet"):
                continue
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name) and importlib.util.find_spec(f"{node.module}.{alias.name}") is None:
                    broken.append(f"{path.name}:{node.lineno}: from {node.module} import {alias.name}")
    assert broken == []


FLOORS = ("base", "plan", "host", "run", "fleet", "cli")
DATA = {"files", "shell", "templates"}  # sent to hosts or rendered; no module imports them


def _floor_of(dotted: str) -> str | None:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "modelfleet" and parts[1] in FLOORS else None


def imports_up(root: Path) -> list[str]:
    """Every import, wherever it stands in a module, that names a higher floor than its module's."""
    found = []
    for name, path in _modules(root).items():
        here = _floor_of(name)
        if here is None:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # `from ..plan import x` climbs from this module's package
                    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    base = ".".join(package[: len(package) - (node.level - 1)] + ([node.module] if node.module else []))
                targets = [base] + ([f"{base}.{a.name}" for a in node.names] if base == root.name else [])
            else:
                continue
            for target in targets:
                there = _floor_of(target.replace(root.name, "modelfleet", 1))
                if there and FLOORS.index(there) > FLOORS.index(here):
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} ({here}) imports {target} ({there})")
    return sorted(found)


def test_every_import_points_down_the_floors():
    assert imports_up(PACKAGE_DIR) == [], "move the name to the module below that it belongs to"


def test_no_module_lies_beside_the_floors():
    loose = sorted(p.name for p in PACKAGE_DIR.iterdir()
                   if p.name not in (*FLOORS, *DATA, "__init__.py", "__pycache__"))
    assert loose == []


def test_an_import_up_the_floors_is_found_wherever_it_stands(tmp_path):
    pkg = tmp_path / "modelfleet"
    _write(tmp_path, {
        "modelfleet/__init__.py": "", "modelfleet/base/__init__.py": "", "modelfleet/plan/__init__.py": "",
        "modelfleet/base/low.py": "def f():\n    from modelfleet.plan import high\n",
        "modelfleet/base/typed.py": "from typing import TYPE_CHECKING\n"
                                    "if TYPE_CHECKING:\n    import modelfleet.plan.high\n",
        "modelfleet/plan/high.py": "from modelfleet.base import low\nfrom modelfleet import base\n",
        "modelfleet/base/relative.py": "from ..plan import high\nfrom .. import plan\nfrom . import low\n",
    })
    assert imports_up(pkg) == ["modelfleet/base/low.py:2 (base) imports modelfleet.plan (plan)",
                               "modelfleet/base/relative.py:1 (base) imports modelfleet.plan (plan)",
                               "modelfleet/base/relative.py:2 (base) imports modelfleet.plan (plan)",
                               "modelfleet/base/typed.py:3 (base) imports modelfleet.plan.high (plan)"]
