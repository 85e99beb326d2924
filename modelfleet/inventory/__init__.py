"""The inventory: schema (what may be said), plan (the typed result), resolver (from one to the other).

This is the one place that reads raw `host.data`. Precedence: catalog defaults < group_data < host data
(pyinfra merges the last two; the catalog fills what neither sets). Every problem is collected, each naming
the host or pool and the field, so `modelfleet validate` reports them all at once.
"""

from modelfleet.inventory.plan import (
    GPU_CHECK_IMAGES,
    STACK_KEYS,
    HostPlan,
    InventoryError,
    PoolPlan,
    Resolved,
    ServicePlan,
    StackPlan,
)
from modelfleet.inventory.resolver import (
    RESERVED_PORTS,
    refuse_invalid,
    resolve,
    resolve_inventory,
)
from modelfleet.inventory.schema import COMMIT_RE, SERVICE_KEYS, HostData, ServiceData

# isort: split
# The door resolves through the modules above: imported last.
from modelfleet.inventory.door import guard, open_inventory

__all__ = ["COMMIT_RE", "GPU_CHECK_IMAGES", "RESERVED_PORTS", "SERVICE_KEYS", "STACK_KEYS", "HostData", "HostPlan",
           "InventoryError", "PoolPlan", "Resolved", "ServiceData", "ServicePlan", "StackPlan", "guard",
           "open_inventory", "refuse_invalid", "resolve", "resolve_inventory"]
