"""Stages, one @deploy per module, run in pipeline order by deploys/serve.py."""

from __future__ import annotations

import weakref

from pyinfra import host, state
from pyinfra.context import ctx_state

from modelfleet.facts.state import DeployedState
from modelfleet.inventory import HostPlan, InventoryError, Resolved, resolve

# Per pyinfra State, so a new run (or a new test) never sees an older inventory.
_resolved: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def resolved() -> Resolved:
    """Resolve the whole inventory once per run; any error stops the run before a host is changed."""
    run = ctx_state.get()  # the State itself: `state` is pyinfra's context proxy
    if run not in _resolved:
        result = resolve([(h.name, h.data.dict()) for h in state.inventory])
        if result.errors:
            raise InventoryError(result.errors)
        _resolved[run] = result
    return _resolved[run]


def host_plan() -> HostPlan:
    return resolved().hosts[host.name]


def read_deployed(wants: list[dict]) -> dict:
    """
    One DeployedState round trip for what several stages need to know (each stage's `wants(plan)`:
    paths, units, images). Read before anything runs, like every pyinfra fact: the stages decide from it.
    """
    merged: dict[str, list[str]] = {"paths": [], "units": [], "images": []}
    for want in wants:
        for kind, items in want.items():
            merged[kind] += [item for item in items if item not in merged[kind]]
    return host.get_fact(DeployedState, **{kind: tuple(items) for kind, items in merged.items()})
