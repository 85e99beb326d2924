"""Every exception class modelfleet defines derives from ModelfleetError and from the builtin or library exception
of its kind."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import paramiko
import pytest

import modelfleet
from modelfleet.base.errors import ModelfleetError

# files/ holds programs run on the hosts with the standard library only (modelfleet is not installed there).
STANDALONE = "modelfleet.files."


def _package_exceptions() -> dict[str, type]:
    found = {}
    for info in pkgutil.walk_packages(modelfleet.__path__, "modelfleet."):
        if info.name.startswith(STANDALONE):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == info.name:
                found[f"{info.name}.{name}"] = obj
    return found


EXCEPTIONS = _package_exceptions()


def test_the_package_defines_exceptions():
    assert {"modelfleet.plan.catalog.CatalogError", "modelfleet.plan.inventory.plan.InventoryError",
            "modelfleet.base.loader.InventoryFileError", "modelfleet.run.checks.cost.PriceError",
            "modelfleet.plan.checkpoint.ModelSourceError", "modelfleet.host.ssh.HostKeyError"} <= set(EXCEPTIONS)


@pytest.mark.parametrize("name", sorted(EXCEPTIONS))
def test_each_derives_from_the_one_base(name):
    assert issubclass(EXCEPTIONS[name], ModelfleetError), f"{name} does not derive from ModelfleetError"


@pytest.mark.parametrize("name, base", [("modelfleet.run.checks.cost.PriceError", ValueError),
                                        ("modelfleet.plan.checkpoint.ModelSourceError", RuntimeError),
                                        ("modelfleet.host.ssh.HostKeyError", paramiko.SSHException)])
def test_each_is_also_the_exception_of_its_kind(name, base):
    assert issubclass(EXCEPTIONS[name], base)


def test_messages_and_fields():
    from modelfleet.plan.catalog import CatalogError
    from modelfleet.plan.inventory.plan import InventoryError

    error = CatalogError("engines.yaml:3", "no engine")
    assert str(error) == "engines.yaml:3: no engine" and error.where == "engines.yaml:3"
    assert str(InventoryError([("host a", "engine", "unknown")])) == "host a: engine: unknown"
