"""Stages, one @deploy per module, run in pipeline order by deploys/serve.py."""

from __future__ import annotations

from pyinfra import host, state

from modelfleet.inventory import HostPlan, InventoryError, Resolved, resolve

_resolved: dict[int, Resolved] = {}


def resolved() -> Resolved:
    """Resolve the whole inventory once per run; any error stops the run before a host is changed."""
    key = id(state.inventory)
    if key not in _resolved:
        result = resolve([(h.name, h.data.dict()) for h in state.inventory])
        if result.errors:
            raise InventoryError(result.errors)
        _resolved[key] = result
    return _resolved[key]


def host_plan() -> HostPlan:
    return resolved().hosts[host.name]
