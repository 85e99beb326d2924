"""modelfleet.plan.inventory: the plan and schema names load with the package; the resolver's and the door's on
first use, so a module needing only a plan type does not load the resolver (which needs such modules:
tests/unit/test_layers)."""

import subprocess
import sys

import pytest


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_a_plan_type_does_not_load_the_resolver():
    out = _run("import sys\nfrom modelfleet.plan.inventory import ServicePlan, HostPlan, COMMIT_RE\n"
               "print('modelfleet.plan.inventory.resolver' in sys.modules,"
               " 'modelfleet.plan.inventory.door' in sys.modules)")
    assert out == "False False"


def test_the_resolver_and_door_names_load_on_first_use():
    out = _run("import sys\nfrom modelfleet.plan.inventory import resolve, open_inventory, guard, RESERVED_PORTS\n"
               "from modelfleet.plan.inventory import resolver, door\n"
               "print(resolve is resolver.resolve, open_inventory is door.open_inventory, guard is door.guard,"
               " RESERVED_PORTS is resolver.RESERVED_PORTS)")
    assert out == "True True True True"


def test_an_unknown_name_is_an_attribute_error():
    import modelfleet.plan.inventory as inventory

    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        inventory.nothing_here  # noqa: B018
    assert set(inventory.__all__) <= {n for n in inventory.__all__ if hasattr(inventory, n)}
