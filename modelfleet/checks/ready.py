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

from modelfleet.checks import Endpoint


def served_models(ep: Endpoint, timeout_s: float = 10) -> list[str]:
    """The ids /v1/models lists (the key as a bearer, as the SDK sends it)."""
    request = urllib.request.Request(f"{ep.openai_base_url}/models",
                                     headers={"Authorization": f"Bearer {ep.api_key or 'no-key'}"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return [model["id"] for model in json.load(response)["data"]]


def readiness(ep: Endpoint, timeout_s: float = 60) -> dict:
    start, last = time.monotonic(), "no answer yet"
    while time.monotonic() - start < timeout_s:
        try:
            with urllib.request.urlopen(f"{ep.base_url}/health", timeout=5) as response:
                health = response.status
            try:
                models = served_models(ep)
            except urllib.error.HTTPError as error:
                raise OSError(f"/v1/models answered {error.code}") from None
            if ep.model in models:
                return {"ok": True, "health": health, "models": models, "seconds": round(time.monotonic() - start, 2)}
            last = f"/v1/models lists {models}, not {ep.model!r}"
        except urllib.error.HTTPError as error:
            last = f"/health answered {error.code}"
        except (urllib.error.URLError, OSError, ValueError, KeyError) as error:
            last = str(error) if str(error).startswith("/v1/models") else f"{type(error).__name__}: {error}"
        time.sleep(1)
    return {"ok": False, "error": f"not ready after {timeout_s:.0f} s: {last}",
            "seconds": round(time.monotonic() - start, 2)}


def report(ep: Endpoint, timeout_s: float = 60) -> dict:
    """The verify report of a readiness-only check."""
    result = readiness(ep, timeout_s)
    return {"endpoint": ep.name, "base_url": ep.openai_base_url, "model": ep.model, "engine": ep.engine,
            "scope": "readiness", "readiness": result, "ok": result["ok"]}
