"""Stages, one @deploy per module, run in pipeline order by deploys/serve.py."""

from __future__ import annotations

import sys
import weakref

from gevent.lock import Semaphore
from pyinfra import host, state
from pyinfra.context import ctx_host, ctx_state

from modelfleet.facts.state import DeployedState
from modelfleet.inventory import HostPlan, InventoryError, Resolved, resolve

# Where stages put the scripts they run on hosts (the fetch script, the NCCL check).
TOOLS_BIN = "/opt/modelfleet/bin"

# Per pyinfra State, so a new run (or a new test) never sees an older inventory or host state.
_resolved: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_stages: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_deployed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_probes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


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


def remember_probe(probe: dict) -> None:
    """Preflight's HostProbe for this host, so later stages read its parts instead of asking again."""
    _probes.setdefault(ctx_state.get(), {})[host.name] = probe


def probe_of(name: str | None = None) -> dict | None:
    """A host's (default: this host's) HostProbe from this run's preflight; None when preflight did not run."""
    return _probes.get(ctx_state.get(), {}).get(name or host.name)


def use_stages(stages) -> None:
    """Declare the stages of this run: what `deployed_of` reads is the union of their `wants(plan)`."""
    _stages[ctx_state.get()] = tuple(stages)


def deployed_of(target=None) -> dict:
    """
    What the run's stages find on `target` (default: this host): one DeployedState round trip per host per
    run, read before anything runs, like every pyinfra fact. Stages that coordinate hosts (the model stage's
    fan-out) read their peers' state through here too, so no host is asked twice.
    """
    run, target = ctx_state.get(), target or ctx_host.get()
    cache, locks = _deployed.setdefault(run, ({}, {}))
    with locks.setdefault(target.name, Semaphore()):
        if target.name not in cache:
            plan = resolved().hosts[target.name]
            merged: dict[str, list[str]] = {"paths": [], "units": [], "images": [], "trees": [], "packages": [],
                                               "texts": []}
            for stage in _stages.get(run, ()):
                for kind, items in stage.wants(plan).items():
                    merged[kind] += [item for item in items if item not in merged[kind]]
            with ctx_host.use(target):
                cache[target.name] = target.get_fact(DeployedState, **{k: tuple(v) for k, v in merged.items()})
    return cache[target.name]


def deployed_for_stage(module_name: str) -> dict:
    """A stage run on its own (not from the pipeline) reads just what it needs."""
    use_stages([sys.modules[module_name]])
    return deployed_of()
