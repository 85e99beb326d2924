"""The exposure probe: an endpoint with an API key must refuse a request that carries none, on
/v1/chat/completions and on the engine's non-/v1 inference route (catalog/key_coverage.yaml's probe_route).
Only 401 or 403 passes: an answer of any other kind means the route runs without the key. A route the
catalog records as open by the engine's design (vLLM's /invocations) is not asked on a loopback endpoint (the
resolver keeps such engines there) and is reported as such. Standard library only: it runs inside the pyinfra
process too."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from modelfleet.plan.exposure import key_coverage
from modelfleet.plan.inventory.plan import _is_loopback
from modelfleet.run.checks import Endpoint, tls_context

REFUSED = (401, 403)


def ask_without_key(url: str, body: dict, timeout_s: float = 10, context=None) -> int | str:
    """The HTTP status a key-less POST gets, or why none came back (`context`: a TLS front door's)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError as error:
        return f"{type(error).__name__}: {error}"


def routes_to_ask(ep: Endpoint) -> tuple[list[tuple[str, dict]], list[str]]:
    """([(route, body)] to ask without a key, [routes left unasked because they are open by design])."""
    chat = {"model": ep.model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 1}
    if ep.refused_routes:  # a front door: every inference route it serves, with a body any of them would run
        body = {**chat, "prompt": "Say hi.", "text": "Say hi.", "input": "Say hi."}
        return [("/v1/chat/completions", chat)] + [(r, body) for r in ep.refused_routes
                                                   if r != "/v1/chat/completions"], []
    coverage = key_coverage().get(ep.engine)
    if coverage is None:
        return [("/v1/chat/completions", chat)], []
    host = urlsplit(ep.base_url).hostname or ""
    # Only loopback keeps an open route to the host itself (elsewhere the resolver puts such an engine behind a
    # keyed proxy, or refuses it): off loopback it is asked like every other.
    if coverage.probe_route in coverage.open_inference_routes and _is_loopback(host):
        return [("/v1/chat/completions", chat)], [coverage.probe_route]
    return [("/v1/chat/completions", chat), (coverage.probe_route, coverage.probe_body)], []


def check(ep: Endpoint, timeout_s: float = 10) -> dict:
    """Ask each route without a key; `ok` when every one was refused. Failures name host, port and route."""
    where = urlsplit(ep.base_url).netloc
    asked, unasked = routes_to_ask(ep)
    routes, failures = [], []
    for route, body in asked:
        status = ask_without_key(f"{ep.base_url}{route}", body, timeout_s, tls_context(ep))
        routes.append({"route": route, "status": status, "refused": status in REFUSED})
        if status not in REFUSED:
            failures.append(failure(where, route, status))
    return {"ok": not failures, "routes": routes, "open_by_design_on_loopback": unasked, "failures": failures}


def failure(where: str, route: str, status: int | str) -> str:
    if isinstance(status, int):
        return (f"{where}{route} answered {status} to a request without the API key (want 401 or 403): the "
                "model is served to anyone who reaches it")
    return f"{where}{route}: no answer to a request without the API key ({status})"


def failures_at(result: dict, where: str) -> list[str]:
    """The result's failures named by `where` (host:port), for a check that went through a tunnel."""
    return [failure(where, r["route"], r["status"]) for r in result.get("routes", []) if not r["refused"]]
