"""Tests mirror the package: every module of modelfleet has a test module of its own, found by its name, so a
reader looking for how a module behaves knows where to look and a new module cannot arrive untested.

The package's floors (base, plan, host, run, fleet: tests/unit/test_layers.py) are folders, not names: a module's
tests are found by its path below its floor. Where a module's tests live:
- <floor>/<name>.py and <floor>/<pkg>/<name>.py: tests/unit/test_<name>.py, test_<pkg>_<name>.py (a
  package's __init__ with code of its own: test_<pkg>.py);
- a stage, modelfleet/run/stages/<name>.py: tests/stages/test_<name>.py, or test_stages_<name>.py where a module of the
  package's top shares the name (pytest imports test modules by their file name: two test_router.py collide);
- a fact module, modelfleet/host/facts/<name>.py: pyinfra-testing cases, tests/facts/<name>.<Fact>/, or tests/unit;
- an operation module, modelfleet/host/operations/<name>.py: pyinfra-testing cases,
  tests/operations/operations.<name>.<operation>/, or tests/unit;
- a program copied to hosts, modelfleet/files/<name>.py: tests/unit/test_<name>.py;
- a package's __main__.py (`python -m PKG`): the package's test module.
"""

from pathlib import Path

from modelfleet import PACKAGE_DIR

TESTS = Path(__file__).resolve().parents[1]
FLOORS = ("base", "plan", "host", "run", "fleet")

# Modules that are pure data (constants, re-exports, a docstring): nothing to run, so nothing to test.
PURE_DATA = {
    "",                # modelfleet/__init__.py: the version and the package's directories
    "facts",           # empty
    "operations",      # empty
    "stages",          # the Stage contract and its constants (test_pipeline holds every stage to it)
    *FLOORS,           # each floor's __init__: its docstring
}


def package_modules() -> list[str]:
    """Every module of the package, dotted below modelfleet ("checks.bench"; a package's __init__ as "checks")."""
    out = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE_DIR).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.append(".".join(parts))
    return out


def below_floor(module: str) -> str:
    """A module's path below its floor ("plan.render" -> "render"; a floor itself is itself)."""
    floor, _, rest = module.partition(".")
    return rest if floor in FLOORS and rest else module


def has_tests(module: str) -> bool:
    module = below_floor(module)
    pkg, _, leaf = module.rpartition(".")
    if leaf == "__main__":  # `python -m PKG`: the package's test module runs it
        return has_tests(pkg)
    if any((TESTS / d / f"test_{module.replace('.', '_')}.py").is_file() for d in ("unit", "door", "stages")):
        return True
    if pkg == "stages":
        return (TESTS / "stages" / f"test_{leaf}.py").is_file()
    if pkg == "files":
        return (TESTS / "unit" / f"test_{leaf}.py").is_file()
    if pkg == "facts":
        return any((TESTS / "facts").glob(f"{leaf}.*/*"))
    if pkg == "operations":
        return any((TESTS / "operations").glob(f"host.operations.{leaf}.*/*"))
    return False


def test_the_walk_finds_the_package():
    modules = package_modules()
    assert {"plan.render", "run.checks", "run.checks.bench", "run.stages.model", "host.facts.gpu",
            "files.nccl_check"} <= set(modules)


def test_every_package_module_has_a_test_module():
    missing = [m for m in package_modules() if below_floor(m) not in PURE_DATA and not has_tests(m)]
    assert missing == [], "modules without a test module of their own (see this file's docstring for where): " + \
        ", ".join(f"modelfleet/{m.replace('.', '/')}" for m in missing)


def test_the_lists_name_only_modules_that_exist():
    assert PURE_DATA <= {below_floor(m) for m in package_modules()}
