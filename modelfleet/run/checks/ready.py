"""Readiness of an endpoint with the standard library alone: /health answers 200 (vLLM/SGLang: engine up;
llama-server: model loaded) and /v1/models lists the served name.

The verify stage asks it inside the pyinfra process on a converge that changed nothing: no openai SDK (its
HTTP stack does not import under pyinfra's gevent patches) and so no child interpreter per endpoint, which
cost about 1.3 CPU seconds per host on the control node."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from modelfleet.run.checks import Endpoint, tls_context


def served_models(ep: Endpoint, timeout_s: float = 10) -> list[str]:
    """The ids /v1/models lists (the key as a bearer, as the SDK sends it)."""
    request = urllib.request.Request(f"{ep.openai_base_url}/models",
                                     headers={"Authorization": f"Bearer {ep.api_key or 'no-key'}"})
    with urllib.request.urlopen(request, timeout=timeout_s, context=tls_context(ep)) as response:
        return [model["id"] for model in json.load(response)["data"]]


def _look(ep: Endpoint) -> tuple[dict | None, str]:
    """One look: (what /health and /v1/models answered, "") when ready, else (None, why not)."""
    try:
        with urllib.request.urlopen(f"{ep.base_url}{ep.health_path}", timeout=5, context=tls_context(ep)) as response:
            health = response.status
    except urllib.error.HTTPError as error:
        return None, f"{ep.health_path} answered {error.code}"
    except OSError as error:
        return None, f"{type(error).__name__}: {error}"
    try:
        models = served_models(ep)
    except urllib.error.HTTPError as error:
        return None, f"/v1/models answered {error.code}"
    except (OSError, ValueError, KeyError, TypeError) as error:
        return None, f"/v1/models: {type(error).__name__}: {error}"
    if (ep.listed or ep.model) not in models:
        return None, f"/v1/models lists {models}, not {ep.listed or ep.model!r}"
    return {"health": health, "models": models}, ""


def readiness(ep: Endpoint, timeout_s: float = 60) -> dict:
    """Looks twice a second until ready or `timeout_s`; the last reason when it never was."""
    start = time.monotonic()
    while True:
        answer, why = _look(ep)
        if answer:
            return {"ok": True, **answer, "seconds": round(time.monotonic() - start, 2)}
        if time.monotonic() - start >= timeout_s:
            return {"ok": False, "error": f"not ready after {timeout_s:.0f} s: {why}",
                    "seconds": round(time.monotonic() - start, 2)}
        time.sleep(0.5)


def report(ep: Endpoint, timeout_s: float = 60) -> dict:
    """The verify report of a readiness-only check."""
    result = readiness(ep, timeout_s)
    return {"endpoint": ep.name, "base_url": ep.openai_base_url, "model": ep.model, "engine": ep.engine,
            "scope": "readiness", "readiness": result, "ok": result["ok"]}
