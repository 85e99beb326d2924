"""The run context: what a stage knows about its host, built once per host by the pipeline and passed to every
stage (`stage.run(ctx)`). Stages look nothing up on their own; everything cached for a run lives here, keyed by
pyinfra's State, so a new run (or a new test) never sees an older inventory or host state.

- `plan` / `inventory`: this host's typed plan and the whole resolved inventory (pools, peers), resolved once;
  an inventory error stops the run before a host is changed.
- `probe`: preflight's HostProbe for this host ({} when preflight did not run): later stages read its parts
  instead of asking again; `probe_on(peer)` reads a peer's once (the same read its own preflight then uses).
- `fabric(pool)`: a multi-node pool's derived fabric (interfaces, HCAs, devices, IMEX, env), from its members'
  probes, computed once per pool.
- `deployed()`: what the run's stages find on the host, one DeployedState round trip per host per run, read
  before anything runs (the union of the stages' `wants(plan, probe)`); `deployed_on(peer)` for stages that
  coordinate hosts (the model fan-out, the pool gates), so no host is asked twice. Each stage sees only what
  its own `wants` declared: reading anything else raises UndeclaredRead, naming the stage and the item, where
  it would otherwise read as "absent" and silently redo its work on every run.
- `stage` / `followed()`: the stage running now, and whether stages follow it in this run.
- `alone`: the stage runs on its own (`pyinfra INV deploys/verify.py`) and acts on everything it covers.
- `pool_starts(pool)`: will this run (re)start a unit of the pool on any of its hosts; computed once per pool.
- `ranks_restarted(pool)`: the pool's hosts whose rank systemd restarted on its own (the pool restarts whole).
- `pool_checks(pool)`: the pool's collective-check reports, filled while executing, judged by its gate.
- `admission`: each host's admission verdict, so a refused host fails its whole pool.
- `fanout(group, schedule)`: a checkpoint group's copy waves (who copies from whom), computed once per run.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyinfra import state as pyinfra_state
from pyinfra.context import ctx_host

from modelfleet.base import runscope
from modelfleet.base.errors import ModelfleetError
from modelfleet.host import os as osfam
from modelfleet.host.fabric import PoolFabric, derive
from modelfleet.host.fabric_run import as_run
from modelfleet.host.facts.probe import HostProbe
from modelfleet.host.facts.state import STATE_KINDS, DeployedState
from modelfleet.host.units import flap_count, rank_restarted, starts
from modelfleet.plan.inventory import HostPlan, InventoryError, Resolved, door


class UndeclaredRead(ModelfleetError):
    """A stage read part of a host's deployed state its wants() does not declare: a fault of that stage."""


@dataclass
class _RunCache:
    """Everything one pyinfra run remembers across hosts and stages."""

    inventory: Resolved
    stages: tuple = ()
    probes: dict[str, dict] = field(default_factory=dict)
    deployed: dict[str, dict] = field(default_factory=dict)
    pool_starts: dict[str, bool] = field(default_factory=dict)
    ranks_restarted: dict[str, dict[str, int]] = field(default_factory=dict)  # pool -> {host: systemd's restarts}
    pool_checks: dict[str, dict[str, dict]] = field(default_factory=dict)
    admission: dict[str, dict] = field(default_factory=dict)  # host -> its verdict in this run
    fanouts: dict[tuple, list] = field(default_factory=dict)  # checkpoint group -> its copy waves
    probe_args: dict = field(default_factory=dict)  # HostProbe's run-wide arguments (preflight's `health`)
    fabrics: dict[str, PoolFabric] = field(default_factory=dict)  # pool -> its fabric
    declared: dict[tuple, dict[str, set]] = field(default_factory=dict)  # (stage, host) -> what it reads there


def _resolved() -> _RunCache:
    result = door.for_run([(h.name, h.data.dict()) for h in runscope.current().inventory])
    if result.errors:
        raise InventoryError(result.errors)
    return _RunCache(inventory=result)


def _cache() -> _RunCache:
    return runscope.slot("context", _resolved)


class _Declared(Mapping):
    """One kind of a host's DeployedState as one stage declared it."""

    def __init__(self, found: dict, declared: set, stage: str, kind: str, host: str) -> None:
        self._found, self._declared, self._where = found, declared, (stage, kind, host)

    def _check(self, key: Any) -> None:
        if key not in self._declared:
            stage, kind, host = self._where
            raise UndeclaredRead(f"stage {stage} reads {kind} {key!r} of host {host} without declaring it in its "
                                 "wants(): a read it does not declare is not made, and would look absent")

    def __getitem__(self, key: Any) -> Any:
        self._check(key)
        return self._found.get(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self._check(key)
        value = self._found.get(key)
        return default if value is None else value

    def __contains__(self, key: object) -> bool:
        self._check(key)
        return key in self._found

    def __iter__(self) -> Iterator:
        return (key for key in self._found if key in self._declared)

    def __len__(self) -> int:
        return sum(1 for _ in self)




@dataclass
class HostRun:
    plan: HostPlan
    inventory: Resolved
    alone: bool
    _cache: _RunCache
    stage: Any = None  # the stage module running now (the pipeline sets it)

    @property
    def stages(self) -> tuple:
        """The stages of this run, in order."""
        return self._cache.stages

    def runs(self, name: str) -> bool:
        """Does a stage of this name run after the current one?"""
        stages = self._cache.stages
        after = stages[stages.index(self.stage) + 1:] if self.stage in stages else stages
        return any(stage.NAME == name for stage in after)

    def followed(self) -> bool:
        """Do stages follow the current one in this run?"""
        stages = self._cache.stages
        return self.stage in stages and stages.index(self.stage) < len(stages) - 1

    @property
    def probe(self) -> dict:
        return self._cache.probes.get(self.plan.name, {})

    def read_probe(self, **args) -> dict:
        """This host's preflight probe (`args`: the run's, e.g. `health`), read once per run: a pool peer's
        fabric may have read it already."""
        self._cache.probe_args = args
        return self.probe_on(self.plan.name)

    def probe_on(self, name: str) -> dict:
        """Host `name`'s HostProbe: one read per host per run, with its fabric part when it is in a multi-node
        pool."""
        cache = self._cache
        with runscope.lock(f"probe {name}"):
            if name not in cache.probes:
                plan = cache.inventory.hosts[name]
                target = pyinfra_state.inventory.get_host(name)
                with ctx_host.use(target):
                    pythons = tuple(sorted({s.venv.python for s in plan.services if s.venv}))
                    cache.probes[name] = target.get_fact(HostProbe, model_root=plan.model_root,
                                                         fabric=multi_node(plan), pythons=pythons,
                                                         **cache.probe_args)
        return cache.probes[name]

    def fabric(self, pool: str) -> PoolFabric:
        """The pool's fabric, derived once per run from its members' probes (head first)."""
        cache = self._cache
        with runscope.lock(f"fabric {pool}"):
            if pool not in cache.fabrics:
                names = cache.inventory.pools[pool].hosts
                cache.fabrics[pool] = derive(pool, [(cache.inventory.hosts[n], self.probe_on(n).get("fabric"))
                                                    for n in names])
        return cache.fabrics[pool]

    def as_run(self, svc):
        """fabric_run.as_run, once per service per run: the same object each time, so what is rendered from it
        (units.unit_files) is rendered once."""
        return runscope.memo("services as run", svc, lambda: as_run(self, svc))

    def deployed(self) -> dict:
        return self.deployed_on(self.plan.name)

    def deployed_on(self, name: str) -> dict:
        """What host `name` holds of what the current stage declares for it (its `wants` of that host's plan);
        the host is read once per run, for all stages."""
        if self.stage is None:
            raise UndeclaredRead("a deployed-state read outside a stage: only the pipeline's stages read it")
        found, declared = self._read(name), self._declared(self.stage, name)
        return {kind: _Declared(found[kind], declared[kind], self.stage.NAME, kind, name) for kind in STATE_KINDS}

    def _declared(self, stage, name: str) -> dict[str, set]:
        """What `stage` declares it reads from host `name`, by kind: its wants() once per host per run."""
        cache = self._cache
        if (stage.NAME, name) not in cache.declared:
            wants = stage.wants(cache.inventory.hosts[name], cache.probes.get(name, {}))
            cache.declared[(stage.NAME, name)] = {kind: set(wants.get(kind, ())) for kind in STATE_KINDS}
        return cache.declared[(stage.NAME, name)]

    def _read(self, name: str) -> dict:
        """What this run's stages find on host `name`: one DeployedState read per host per run."""
        cache = self._cache
        with runscope.lock(f"deployed {name}"):
            if name not in cache.deployed:
                merged: dict[str, set] = {kind: set() for kind in STATE_KINDS}
                for stage in cache.stages:
                    for kind, items in self._declared(stage, name).items():
                        merged[kind] |= items
                target = pyinfra_state.inventory.get_host(name)
                with ctx_host.use(target):
                    # Packages as the host's OS family reads them (preflight's probe names the OS).
                    family = osfam.family_name((cache.probes.get(name) or {}).get("os"))
                    cache.deployed[name] = target.get_fact(DeployedState, family=family,
                                                           **{k: tuple(sorted(v)) for k, v in merged.items()})
        return cache.deployed[name]

    def pool_checks(self, pool: str) -> dict[str, dict]:
        """Where the pool's hosts put their collective-check reports while executing (host -> report), for
        the gate that judges them together."""
        return self._cache.pool_checks.setdefault(pool, {})

    @property
    def admission(self) -> dict[str, dict]:
        """Each host's admission verdict in this run (host -> {"ok", "reasons"}), filled while planning, read
        by every pool member's admission gate while executing, when all of them are in."""
        return self._cache.admission

    def fanout(self, group: tuple, schedule) -> list:
        """A checkpoint group's copy waves, computed once per run (`schedule()`) for all of its hosts."""
        if group not in self._cache.fanouts:
            self._cache.fanouts[group] = schedule()
        return self._cache.fanouts[group]

    def pool_starts(self, pool: str) -> bool:
        """Will this run (re)start a unit of `pool` on any of its hosts? (Each host's state read once.)"""
        cache = self._cache
        if pool not in cache.pool_starts:
            members = cache.inventory.pools[pool].hosts
            # Read through the asking stage's view: a stage that asks declares units.start_reads in its wants.
            cache.pool_starts[pool] = any(starts(cache.inventory.hosts[name], self.deployed_on(name), pool,
                                                 self.as_run) for name in members)
        return cache.pool_starts[pool]

    def ranks_restarted(self, pool: str) -> dict[str, int]:
        """The hosts of a pool across hosts whose rank systemd restarted on its own, with how often (read through
        the asking stage's view, as pool_starts)."""
        cache = self._cache
        if pool not in cache.ranks_restarted:
            counts = {name: rank_restarted(cache.inventory.hosts[name], self.deployed_on(name), pool)
                      for name in cache.inventory.pools[pool].hosts}
            cache.ranks_restarted[pool] = {name: n for name, n in counts.items() if n}
        return cache.ranks_restarted[pool]

    def rank_flaps(self, pool: str) -> dict[str, int]:
        """The pool restarts in a row each host's dying rank caused (units.flap_count), where there were any."""
        counts = {name: flap_count(self._cache.inventory.hosts[name], self.deployed_on(name), pool)
                  for name in self._cache.inventory.pools[pool].hosts}
        return {name: n for name, n in counts.items() if n}


def multi_node(plan: HostPlan) -> bool:
    """Does the host serve a pool that spans hosts (its probe then reads the fabric)?"""
    return any(svc.nnodes > 1 for svc in plan.services)


def host_run(stages: tuple, alone: bool = False) -> HostRun:
    """The context for the current host. `stages`: those of this run (what `deployed()` reads covers all of
    them); the first call of a run declares them."""
    cache = _cache()
    if stages and not cache.stages:
        cache.stages = tuple(stages)
    return HostRun(plan=cache.inventory.hosts[ctx_host.get().name], inventory=cache.inventory, alone=alone,
                   _cache=cache)
