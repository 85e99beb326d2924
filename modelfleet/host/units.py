"""What the service stage will write for each service (unit, env and secret files, from the pinned service)
and whether a host's unit of a pool (re)starts in this run: read by the service stage, and through the run
context's `pool_starts` by the netcheck gate and the verify stage, which act only when a pool (re)starts."""

from __future__ import annotations

from dataclasses import dataclass

from modelfleet.base import runscope
from modelfleet.host.operations.files import content_changes
from modelfleet.plan import render, weight_cache
from modelfleet.plan.inventory.plan import HostPlan, ServicePlan
from modelfleet.plan.pins import pinned_service

UNIT_DIR = "/etc/systemd/system"


def _engine_paths(svc: ServicePlan) -> list[str]:
    paths = [f"{UNIT_DIR}/{svc.unit_name}", svc.env_file]
    paths += [render.modelfile_path(svc)] if svc.engine.registration else []
    return paths + ([svc.secrets_config_file] if render.secrets_in_config(svc) else [])


def weights_paths(svc: ServicePlan) -> list[str]:
    """The weight cache unit's file and its environment file, where the service has one."""
    if weight_cache.spec(svc) is None:
        return []
    return [f"{UNIT_DIR}/{weight_cache.unit_name(svc)}", weight_cache.env_file(svc)]


def unit_paths(svc: ServicePlan) -> list[str]:
    """Where unit_files puts the service's files (known without rendering them)."""
    return _engine_paths(svc) + weights_paths(svc)


def unit_files(svc: ServicePlan, mask: bool = False) -> list[tuple[str, str, str, bool]]:
    """(path, content, mode, secret) for everything the service's unit depends on; rendered once per run for
    each form of the service (as pinned, as its host runs it), however many stages and peers ask. `mask`: the
    secret files with their secrets masked, as `modelfleet render` shows them (never memoized: shown once)."""
    if mask:
        return _rendered(svc, mask=True)
    return list(runscope.memo("unit files", svc, lambda: _rendered(svc)))


def _rendered(svc: ServicePlan, mask: bool = False) -> list[tuple[str, str, str, bool]]:
    unit, env, *rest = _engine_paths(svc)
    files = [(unit, render.render_unit(svc), "0644", False), (env, render.render_env(svc, mask=mask), "0600", True)]
    if svc.engine.registration:  # the Modelfile its unit registers the checkpoint with (no secret in it)
        files.append((rest.pop(0), render.render_modelfile(svc), "0644", False))
    files += [(path, render.render_secrets_config(svc, mask=mask), "0600", True) for path in rest]
    weights = weights_paths(svc)
    if weights:
        files += [(weights[0], render.render_weights_unit(svc), "0644", False),
                  (weights[1], render.render_weights_env(svc, mask=mask), "0600", True)]
    return files


# A rank of a pool across hosts that died restarts its whole pool; one that keeps dying is held out after this
# many such restarts in a row (one per converge), so the pool is not restarted on every converge.
FLAP_LIMIT = 3


def flap_file(plan: HostPlan, pool: str) -> str:
    """Where a host counts the pool restarts its dying rank caused in a row (the count, then a newline)."""
    return f"{plan.config_dir}/{pool}.rank-restarts"


def flap_count(plan: HostPlan, state: dict, pool: str) -> int:
    """That count, read from the file's digest (DeployedState reads digests, not contents): 0 without one."""
    entry = state["paths"].get(flap_file(plan, pool)) or {}
    if entry.get("kind") != "file":
        return 0
    return next((n for n in range(1, FLAP_LIMIT + 10) if not content_changes(entry, f"{n}\n", "0644")), 0)


def start_reads(plan: HostPlan) -> dict[str, list[str]]:
    """What starts() reads of a host: declared by every stage that asks whether a pool (re)starts (names and
    paths only: no pin is needed to know them)."""
    return {"paths": [path for svc in plan.services for path in unit_paths(svc)]
            + [flap_file(plan, svc.pool) for svc in plan.services if svc.nnodes > 1],
            "units": [unit for svc in plan.services for unit in weight_cache.unit_names(svc)]}


def pinned_services(plan: HostPlan) -> list[ServicePlan]:
    """The host's services as their units run them, worked out once per host per run (the pins do not change
    while it runs; the stages ask for a host's services, the engine cache stage for each peer's, many times)."""
    return list(runscope.memo("pinned services", plan, lambda: [pinned_service(plan, svc) for svc in plan.services]))


def edited(svc: ServicePlan, state: dict) -> dict[str, bool]:
    at = state["paths"].get
    return {path: content_changes(at(path), content, mode) for path, content, mode, _ in unit_files(svc)}


def engine_edited(svc: ServicePlan, state: dict) -> bool:
    """Does the engine's unit change (its own files: the weight cache's change restarts only the cache)?"""
    weights = weights_paths(svc)
    return any(changed for path, changed in edited(svc, state).items() if path not in weights)


@dataclass(frozen=True)
class Merged:
    """What systemd merges into a unit modelfleet owns, beside the file modelfleet wrote: `foreign` drop-ins (and
    a unit file of the same name that outranks ours) to remove, a mask to lift, a daemon-reload pending; `restart`
    when any of it changes the running service (a [Service] setting, another unit file, a pending reload)."""

    foreign: tuple[str, ...] = ()
    masked: bool = False
    reload: bool = False
    restart: bool = False

    @property
    def drift(self) -> bool:
        return bool(self.foreign or self.masked or self.reload)


def _service_keys(text: str | None) -> list[str]:
    """The [Service] settings a drop-in sets (`ExecStart`, `Restart`, ...)."""
    keys, section = [], None
    for line in (text or "").splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith(("#", ";")):
            keys.append(line.split("=", 1)[0].strip())
    return keys


def merged(unit: str, current: dict) -> Merged:
    """Read from the unit's DeployedState. Drop-ins for every service alike (`service.d/`) are the system's,
    not a change to this unit."""
    ours = f"{UNIT_DIR}/{unit}"
    texts = current.get("dropins") or {}
    foreign = [p for p in current.get("DropInPaths") or [] if p.split("/")[-2:-1] != ["service.d"]]
    fragment = current.get("FragmentPath") or ""
    masked = current.get("LoadState") == "masked"
    shadowed = fragment not in ("", ours, "/dev/null") and not masked
    restart = shadowed or current.get("NeedDaemonReload") == "yes" or any(_service_keys(texts.get(p))
                                                                           for p in foreign)
    return Merged(foreign=tuple(foreign + ([fragment] if shadowed else [])), masked=masked,
                  reload=bool(foreign) or shadowed or masked or current.get("NeedDaemonReload") == "yes",
                  restart=restart and current.get("ActiveState") == "active")


def what_it_sets(unit: str, current: dict, path: str) -> str:
    """For a line naming a foreign file: the [Service] settings it changes, or that it replaces the unit."""
    if path == current.get("FragmentPath"):
        return f"a unit file of its own that systemd reads instead of {UNIT_DIR}/{unit}"
    keys = _service_keys((current.get("dropins") or {}).get(path))
    return f"sets {', '.join(dict.fromkeys(keys))}" if keys else "sets no [Service] setting"


def rank_restarted(plan: HostPlan, state: dict, pool: str) -> int:
    """How often systemd restarted the host's rank of `pool` on its own since it was last started (0 for a pool on
    one host). A rank of a pool across hosts that died cannot rejoin the ranks still running (their collectives,
    and vLLM's data-parallel handshake, form once at start: the real vLLM's restarted headless rank waits for good),
    so the whole pool restarts. The service stage sets the count back to 0 once a pool it started is up."""
    for svc in pinned_services(plan):
        if svc.pool == pool and svc.nnodes > 1:
            count = (state["units"].get(svc.unit_name) or {}).get("NRestarts") or "0"
            return int(count) if count.isdigit() else 0
    return 0


def starts(plan: HostPlan, state: dict, pool: str, as_run=None) -> bool:
    """Will this run (re)start the host's unit of `pool`? (What the netcheck gate must clear first.) `as_run`:
    the service as its containers run on the host (fabric_run.as_run), so its unit is compared as the service
    stage renders it."""
    for svc in pinned_services(plan):
        if svc.pool == pool:
            if as_run is not None:
                svc = as_run(svc)
            unit = state["units"].get(svc.unit_name) or {}
            return (engine_edited(svc, state) or unit.get("ActiveState") != "active"
                    or merged(svc.unit_name, unit).restart
                    or (rank_restarted(plan, state, pool) > 0 and flap_count(plan, state, pool) < FLAP_LIMIT))
    return False
