"""modelfleet.op_order gives pyinfra's operation order exactly as pyinfra's own function does, from frames."""

from types import SimpleNamespace

import pyinfra
import pytest
from pyinfra.api import util

from modelfleet import op_order


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
