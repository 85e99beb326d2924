"""Who can reach the model: what each engine's API key protects (catalog/key_coverage.yaml) and the rule for an
endpoint bound off loopback. Such an endpoint is accepted only when it has a key and the key covers every
route that serves the model; an engine whose key leaves an inference route open (vLLM's /invocations) stays on
loopback, behind a front door that authenticates every route. `modelfleet verify` proves the rule on the
running engines (modelfleet.run.checks.exposure)."""

from __future__ import annotations

from functools import lru_cache

from pydantic import BaseModel, ConfigDict

from modelfleet.plan.catalog import CATALOG_DIR, read_yaml


class KeyCoverage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    source: str
    version: str | None = None  # the engine release whose own route table the lists were checked against
    guarded_prefixes: list[str] = []  # the path prefixes the key guards, where the engine's code says so
    covers: str  # in words, for messages
    open_routes: list[str]  # routes the key leaves open
    open_inference_routes: list[str]  # of those, the ones that run the model on a caller's input
    probe_route: str  # a non-/v1 inference route: asked with no key, it must refuse (or be one of the open ones)
    probe_body: dict


@lru_cache(maxsize=None)
def key_coverage() -> dict[str, KeyCoverage]:
    data = read_yaml((CATALOG_DIR / "key_coverage.yaml").read_text())
    return {engine: KeyCoverage(**spec) for engine, spec in data.items()}


def off_loopback_problem(engine: str, bind_address: str, api_key_env: str | None) -> str | None:
    """Why an endpoint bound to `bind_address` (not loopback) would serve the model to anyone who reaches it,
    or None when every route that serves it needs the key."""
    if not api_key_env:
        return (f"{bind_address} is not loopback: set `api_key_env` (name of the control-node variable holding "
                "the API key) or bind to 127.0.0.1")
    coverage = key_coverage().get(engine)
    if coverage is None:
        return (f"{bind_address} is not loopback and modelfleet does not know which routes {engine}'s API key "
                "protects: bind to 127.0.0.1")
    if coverage.open_inference_routes:
        return (f"{bind_address} is not loopback, and {engine}'s API key protects {coverage.covers}: "
                f"{', '.join(coverage.open_inference_routes)} run the model without a key (source: "
                f"{coverage.source}). "
                "Leave `bind_address` unset (127.0.0.1); for clients on the network set `router` (and "
                "`api_key_env`): the model's front door authenticates every route, the replicas listen for it only")
    return None


def routed_replica_problem(engine: str, address: str, router_host: str, pd: bool = False) -> str | None:
    """Why a replica behind the front door on `router_host`, listening on `address` (its fabric address, off
    loopback), would serve the model to anyone on that network without the key; None when its own key covers
    every route that runs the model. Asked where no keyed proxy can cover it (door_needed: a PD server, or an
    engine whose coverage is unknown): such a replica is refused, not exposed."""
    coverage = key_coverage().get(engine)
    if coverage is not None and not coverage.open_inference_routes:
        return None
    what = (f"{engine}'s API key protects {coverage.covers}: {', '.join(coverage.open_inference_routes)} run the "
            f"model without the key (source: {coverage.source})") if coverage else \
        f"modelfleet does not know which routes {engine}'s API key protects"
    where = (f"the {pd} server would listen on {address} for the router on {router_host} and the other part"
             if pd else f"the replica would listen on {address} for the router on {router_host}")
    fix = ("a prefill/decode server listens on its fabric address even beside its router, so this layout cannot "
           f"be served with {engine} until a keyed proxy sits before each server" if pd else
           f"Serve it from {router_host} itself (a replica beside its router listens on loopback), or without "
           "`router`")
    return f"{where}, and {what}, for anyone who reaches {address}. {fix}"


def door_needed(engine: str) -> bool:
    """A routed replica of `engine` off loopback sits behind a keyed proxy on its own host
    (modelfleet.plan.replica_door): its key is known to leave a model route open. Unknown coverage is refused
    instead (routed_replica_problem)."""
    coverage = key_coverage().get(engine)
    return bool(coverage and coverage.open_inference_routes)
