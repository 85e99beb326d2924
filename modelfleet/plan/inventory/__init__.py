"""The inventory: schema (what may be said), plan (the typed result), resolver (from one to the other).

This is the one place that reads raw `host.data`. Precedence: catalog defaults < group_data < host data
(pyinfra merges the last two; the catalog fills what neither sets). Every problem is collected, each naming
the host or pool and the field, so `modelfleet validate` reports them all at once.

The plan and schema names load with the package; the resolver's and the door's load on first use (PEP 562), so a
low module that only needs a plan type (caches, render, the stages) never loads the resolver, which itself needs
those modules: the layers stay acyclic (tests/unit/test_layers.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from modelfleet.plan.inventory.plan import (
    GPU_CHECK_IMAGES,
    STACK_KEYS,
    HostPlan,
    InventoryError,
    PoolPlan,
    Resolved,
    ServicePlan,
    StackPlan,
)
from modelfleet.plan.inventory.schema import COMMIT_RE, SERVICE_KEYS, HostData, ServiceData

if TYPE_CHECKING:
    from modelfleet.plan.inventory.door import guard, open_inventory, refuse_invalid, resolve_inventory
    from modelfleet.plan.inventory.resolver import RESERVED_PORTS, resolve

# Name -> the module that defines it, imported when the name is first asked for.
_LATE = {"RESERVED_PORTS": "resolver", "resolve": "resolver", "guard": "door", "open_inventory": "door",
         "refuse_invalid": "door", "resolve_inventory": "door"}


def __getattr__(name: str):
    if name not in _LATE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LATE[name]}"), name)
    globals()[name] = value
    return value


__all__ = ["COMMIT_RE", "GPU_CHECK_IMAGES", "RESERVED_PORTS", "SERVICE_KEYS", "STACK_KEYS", "HostData", "HostPlan",
           "InventoryError", "PoolPlan", "Resolved", "ServiceData", "ServicePlan", "StackPlan", "guard",
           "open_inventory", "refuse_invalid", "resolve", "resolve_inventory"]
