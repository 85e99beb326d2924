"""modelfleet.base.op_order gives pyinfra's operation order exactly as pyinfra's own function does, from frames."""

from types import SimpleNamespace

import pyinfra
import pytest
from pyinfra.api import util

from modelfleet.base import op_order


def both(state):
    """Both functions called from one line of one frame, so their callers' line numbers agree."""
    return util.get_operation_order_from_stack(state), op_order.operation_order_from_stack(state)


def nested(depth: int, state):
    return nested(depth - 1, state) if depth else both(state)


@pytest.mark.parametrize("is_cli", [True, False])
@pytest.mark.parametrize("deploy_file", [None, __file__, "/nowhere/deploy.py"])
@pytest.mark.parametrize("depth", [0, 5, 30])
def test_same_order_as_pyinfra(monkeypatch, is_cli, deploy_file, depth):
    monkeypatch.setattr(pyinfra, "is_cli", is_cli)
    state = SimpleNamespace(current_deploy_filename=deploy_file, current_op_file_number=3)
    ours, theirs = nested(depth, state)[1], nested(depth, state)[0]
    assert ours == theirs
    if deploy_file != "/nowhere/deploy.py":  # the stack was read: a line for each frame of ours at least
        assert len(ours) > depth


def test_installed_only_over_pyinfras_own():
    import importlib
    module = importlib.import_module("pyinfra.api.operation")
    op_order.install()
    assert module.get_operation_order_from_stack is op_order.operation_order_from_stack


@pytest.fixture
def stock(monkeypatch):
    """pyinfra's own function in place for the test, whatever an earlier test installed."""
    import importlib
    module = importlib.import_module("pyinfra.api.operation")
    monkeypatch.setattr(module, "get_operation_order_from_stack", util.get_operation_order_from_stack)
    return module


def test_an_unchecked_pyinfra_release_keeps_its_own(monkeypatch, stock):
    monkeypatch.setattr(op_order, "pyinfra_series", lambda: "3.99")
    assert op_order.install() is False
    assert stock.get_operation_order_from_stack is util.get_operation_order_from_stack


def test_the_installed_pyinfra_is_a_checked_release(stock):
    """The suite's pyinfra is one the order was held to above: a new release fails here until it is added."""
    assert op_order.pyinfra_series() in op_order.CHECKED_PYINFRA
    assert op_order.install() is True and op_order.install() is True  # idempotent
    assert stock.get_operation_order_from_stack is op_order.operation_order_from_stack


@pytest.mark.slow
def test_importing_the_deploys_patches_nothing():
    import subprocess
    import sys
    code = ("import importlib, modelfleet.run.deploys, modelfleet.run.pipeline; from pyinfra.api import util; "
            "print(importlib.import_module('pyinfra.api.operation').get_operation_order_from_stack "
            "is util.get_operation_order_from_stack)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"


def test_run_stages_installs_it_first(monkeypatch):
    from modelfleet.run import pipeline

    class Installed(Exception):
        pass

    def install():
        raise Installed

    monkeypatch.setattr(op_order, "install", install)
    with pytest.raises(Installed):
        pipeline.run_stages()


def test_global_arguments_are_pyinfras_own():
    """The list read once equals pyinfra's, names, types and order; callers may change their copy."""
    from pyinfra.api import arguments

    theirs = op_order._PYINFRA_GLOBAL_ARGUMENTS()
    assert op_order.global_arguments() == theirs and {"_sudo", "_env", "_run_once"} <= dict(theirs).keys()
    mine = op_order.global_arguments()
    mine.clear()
    assert op_order.global_arguments() == theirs
    op_order.install()
    assert arguments.all_global_arguments is op_order.global_arguments


def test_an_unchecked_pyinfra_release_keeps_its_global_arguments(monkeypatch, stock):
    from pyinfra.api import arguments

    monkeypatch.setattr(arguments, "all_global_arguments", op_order._PYINFRA_GLOBAL_ARGUMENTS)
    monkeypatch.setattr(op_order, "pyinfra_series", lambda: "3.99")
    assert op_order.install() is False
    assert arguments.all_global_arguments is op_order._PYINFRA_GLOBAL_ARGUMENTS
