"""Client-side checks run from the control node through the openai SDK: readiness, smoke, tool-call probe
(probe.py), key-less requests that every keyed endpoint must refuse (exposure.py), the acceptance bench
(bench.py) and cost per successful task (cost.py)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from modelfleet.plan import render
from modelfleet.plan.inventory.plan import HostPlan, Resolved, ServicePlan


@dataclass(frozen=True)
class Endpoint:
    name: str          # host/pool, for reports
    base_url: str      # without /v1
    model: str         # the served name
    engine: str
    api_key: str | None = None
    pool: str | None = None
    tool_choice: str = "auto"        # the recipe's probe settings (catalog ProbeSettings)
    final_tool_choice: str = "auto"
    refused_routes: tuple[str, ...] = ()  # a front door's inference routes: each must refuse a key-less request
    ca_file: str | None = None  # a TLS front door's certificate chain (control node): the checks trust it only
    server_name: str | None = None  # the name its certificate must cover (router_server_name, else its address)
    health_path: str = "/health"  # what answers 200 once the server is up (Ollama has no /health)
    listed: str | None = None  # the served name as /v1/models lists it, where the engine adds to it (Ollama)

    @property
    def openai_base_url(self) -> str:
        return f"{self.base_url}/v1"


def tls_context(ep: Endpoint) -> ssl.SSLContext | None:
    """The checks' TLS view of a front door with its own certificate: pinned to the chain the site gave (any
    certificate of it is an anchor, so a CA-issued chain and a self-signed one both verify), and the name checked
    as a client checks it: the endpoint's `server_name` (router_server_name, else its address), whatever address
    the check dials (the front door's, an SSH tunnel's 127.0.0.1). None: plain HTTP."""
    if not ep.ca_file:
        return None
    context = ssl.create_default_context(cafile=ep.ca_file)  # under pyinfra, gevent's (its patched ssl module)
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    context.check_hostname = True
    if ep.server_name:
        # urllib and httpx hand the URL's host to wrap_socket: the name clients use replaces it (an instance
        # attribute, not a subclass, so gevent's context class stays the one in use).
        dial = context.wrap_socket

        def named(sock, *args, server_hostname=None, **kwargs):
            return dial(sock, *args, server_hostname=ep.server_name, **kwargs)

        context.wrap_socket = named
    return context


def reachable_from_control_node(plan: HostPlan, svc: ServicePlan) -> bool:
    """
    A loopback-bound endpoint is reachable from here only when the host shares this machine's loopback (the
    lab: each host's sshd listens on the very address its engine binds); otherwise it takes an SSH tunnel.
    """
    if svc.door_address and not svc.router:  # its keyed proxy listens off loopback: asked there, as clients do
        return True
    return not svc.loopback or plan.address in (svc.bind_address, "@local")


def endpoint(plan: HostPlan, svc: ServicePlan) -> Endpoint:
    # A keyless engine's own keyed proxy (no front door): where clients reach it, and what verify asks.
    base_url = svc.router_url if svc.door_address and not svc.router else svc.base_url
    return Endpoint(name=f"{plan.name}/{svc.pool}", base_url=base_url, model=svc.served_name,
                    engine=svc.engine_name, api_key=render.api_key(svc), pool=svc.pool,
                    tool_choice=svc.recipe.probe.tool_choice, final_tool_choice=svc.recipe.probe.final_tool_choice,
                    health_path=svc.engine.health_path, listed=render.listed_name(svc))


def inventory_endpoints(resolved: Resolved, hosts: tuple[str, ...] = ()) -> list[Endpoint]:
    """Every service of the inventory's hosts (or of `hosts`), the head node only for multi-node pools."""
    out = []
    for name, plan in resolved.hosts.items():
        if hosts and name not in hosts:
            continue
        out += [endpoint(plan, svc) for svc in plan.services if svc.node_rank == 0]
    return out
