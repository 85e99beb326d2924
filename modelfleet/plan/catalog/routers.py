"""The routers catalog (catalog/routers.yaml): for each engine, its own router's package, flags, policies and worker
API, and its prefill/decode mode; what a recipe's flags say about its part in a PD layout. Data only: the
inventory checks a front door against it (modelfleet.plan.inventory.routed) and modelfleet.plan.router renders
from it."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from modelfleet.plan.catalog import CATALOG_DIR, read_yaml

if TYPE_CHECKING:
    from modelfleet.plan.inventory.plan import RouterPlan


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorkerCall(_Strict):
    method: Literal["GET", "POST", "DELETE"]
    path: str
    body: dict[str, str] | None = None  # JSON body; `{url}` and `{model}` are the replica's URL and served name


class PdRole(_Strict):
    """How a recipe says which part of a PD layout its server plays: the value of `flag` (or of `key` in that
    flag's JSON) is `prefill` or `decode`'s."""

    flag: str
    key: str | None = None
    prefill: str
    decode: str


class PdBootstrap(_Strict):
    """A prefill server's bootstrap port (the engine's flag, and its default), which the router is told."""

    flag: str
    default: int


class PdSpec(_Strict):
    """The router's prefill/decode mode, and what the engine's servers get from the pool's fabric: `engine_env`
    and `engine_args` map a variable or flag to `address` (the member's own address), `hcas` (the derived
    HCAs, comma-separated) or `hca_ports` (the same with their ports, as NCCL_IB_HCA names them)."""

    source: str
    flag: str
    prefill_flag: str
    decode_flag: str
    role: PdRole
    bootstrap: PdBootstrap | None = None
    engine_env: dict[str, Literal["address", "hcas", "hca_ports"]] = {}
    engine_args: dict[str, Literal["address", "hcas", "hca_ports"]] = {}


class RouterSpec(_Strict):
    source: str
    package: str
    version: str
    module: str
    auth: Literal["router", "proxy"]  # who refuses a request without the key: the router, or a proxy before it
    args: list[str]
    worker_urls_flag: str
    host_flag: str
    port_flag: str
    api_key_flag: str
    admin_keys_flag: str | None = None  # the control plane's keys: set, the worker API takes modelfleet's key only
    # How the router gets its replicas: --worker-urls when it starts (then the worker API), the worker API once it
    # answers, or a manifest file it watches (`discovery_args`, `{manifest}`: the file) that modelfleet rewrites.
    start: Literal["flag", "api", "file"]
    discovery_args: list[str] = []
    policies: list[str]
    inference_routes: list[str]  # what a key-less request must be refused on, at the front door
    client_routes: list[str]  # what else an nginx front door forwards with a client's key (`{id}`: one segment)
    workers: dict[Literal["list", "add", "remove"], WorkerCall]
    pd: PdSpec | None = None  # none: the router has no prefill/decode mode


@lru_cache(maxsize=1)
def specs() -> dict[str, RouterSpec]:
    """The routers catalog: engine -> its router."""
    data = read_yaml((CATALOG_DIR / "routers.yaml").read_text())
    return {engine: RouterSpec(**entry) for engine, entry in data.items()}


def spec(rp: RouterPlan) -> RouterSpec:
    return specs()[rp.engine_name]


def pd_spec(engine_name: str) -> PdSpec | None:
    entry = specs().get(engine_name)
    return entry.pd if entry else None


def _flag_value(args, flag: str) -> str | None:
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name == flag:
            return value if eq else (args[i + 1] if i + 1 < len(args) else None)
    return None


def pd_role(recipe, engine_name: str) -> str | None:
    """`prefill` or `decode` when the recipe's own flags make its server one part of a PD layout, else None."""
    pd = pd_spec(engine_name)
    value = _flag_value(recipe.args, pd.role.flag) if pd else None
    if value is not None and pd.role.key:
        try:
            value = json.loads(value).get(pd.role.key)
        except (ValueError, AttributeError):
            value = None
    return {pd.role.prefill: "prefill", pd.role.decode: "decode"}.get(value) if pd and value else None


def bootstrap_port(recipe, engine_name: str) -> int | None:
    """A prefill server's bootstrap port: the recipe's, else the engine's default (None: the engine has none)."""
    pd = pd_spec(engine_name)
    if not (pd and pd.bootstrap):
        return None
    given = _flag_value(recipe.args, pd.bootstrap.flag)
    return int(given) if given else pd.bootstrap.default
