"""Stages, one @deploy per module, run in the order a deploy lists them (modelfleet.run.pipeline.SERVE for
serve.py). Every stage module keeps the contract below; modelfleet.run.pipeline runs them as a plain loop."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from modelfleet.base.host_commands import TOOLS_BIN  # noqa: F401  (re-exported: its home is the host commands)
from modelfleet.host.facts.state import STATE_KINDS  # its home is the state fact

if TYPE_CHECKING:
    from modelfleet.plan.inventory.plan import HostPlan
    from modelfleet.run.context import HostRun

# What a stage may declare in wants(): the parts of the host's DeployedState it reads (STATE_KINDS, whose home is
# that fact), and `probe`, the parts of preflight's HostProbe that preflight must read for it (e.g. the GPUs' health).
WANT_KINDS = (*STATE_KINDS, "probe")


@runtime_checkable
class Stage(Protocol):
    """A stage module.

    NAME: how reports, errors and the pins name it.
    PINS: the pins its operations use, of "images" (digests), "revisions" (checkpoint commits) and "listings"
          (a checkpoint's file list); a host whose pins do not resolve gets no stage of a run that needs them.
    wants(plan, probe): what it reads from the host, by kind (WANT_KINDS): the one declaration its operations
          derive from; the run context reads the union once per host, and a stage that reads anything it did
          not declare fails, naming itself and what it read.
    run(ctx): its operations for the context's host; False when the host must go no further in this run.
    """

    NAME: str
    PINS: frozenset[str]

    def wants(self, plan: HostPlan, probe: dict) -> dict[str, list[str]]: ...

    def run(self, ctx: HostRun) -> bool | None: ...
