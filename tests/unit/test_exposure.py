"""Exposure: an endpoint off loopback is accepted only when every route that serves the model needs the key
(the resolver, from catalog/key_coverage.yaml), and the lab's engine double keys the routes each engine keys (the
key-less probe itself, checks/exposure.py, is tested in test_checks_exposure.py)."""

from __future__ import annotations

import importlib.util
import json
import threading
import urllib.error
import urllib.request
from http.server import ThreadingHTTPServer

import pytest

from modelfleet.plan.catalog import load_catalog
from modelfleet.plan.exposure import key_coverage, off_loopback_problem
from modelfleet.plan.inventory import resolve
from modelfleet.run.stages.verify import _failures
from tests.conftest import ROOT

PIN = "d" * 40
KEY = "k-exposure-test"


def _double():
    spec = importlib.util.spec_from_file_location("engine_double", ROOT / "lab" / "engine_double" / "engine_double.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DOUBLE = _double()


def host(engine: str, **extra) -> dict:
    model, hardware, recipe = {"vllm": ("qwen3-8b", "h200", None), "sglang": ("kimi-k3.1-pro", "b300", None),
                               "llama.cpp": ("kimi-k3", "h200", "kimi-k3-llamacpp-h200")}[engine]
    data = {"ssh_hostname": "192.0.2.30", "hardware": hardware, "model": model, "engine": engine,
            "recipe": recipe, "revision": PIN, **extra}
    return {k: v for k, v in data.items() if v is not None}


def bind_errors(entries, monkeypatch) -> list[tuple[str, str, str]]:
    monkeypatch.setenv("EXPOSURE_KEY", KEY)
    return [e for e in resolve(entries).errors if e[1] == "bind_address"]


def test_vllm_off_loopback_is_refused_even_with_a_key(monkeypatch):
    errors = bind_errors([("gpu-7", host("vllm", bind_address="10.0.0.7", api_key_env="EXPOSURE_KEY"))],
                         monkeypatch)
    assert len(errors) == 1
    where, field, message = errors[0]
    assert (where, field) == ("host gpu-7", "bind_address")
    assert message.startswith("10.0.0.7 is not loopback")
    assert "/invocations" in message and "Leave `bind_address` unset (127.0.0.1)" in message
    assert "set `router`" in message and "front door" in message
    assert KEY not in message


@pytest.mark.parametrize("engine", ["sglang", "llama.cpp"])
def test_engines_whose_key_covers_inference_may_listen_off_loopback(monkeypatch, engine):
    assert bind_errors([("h", host(engine, bind_address="0.0.0.0", api_key_env="EXPOSURE_KEY"))], monkeypatch) == []


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llama.cpp"])
def test_off_loopback_without_a_key_is_refused_and_loopback_is_not(monkeypatch, engine):
    errors = bind_errors([("h", host(engine, bind_address="0.0.0.0"))], monkeypatch)
    assert [(w, f) for w, f, _ in errors] == [("host h", "bind_address")] and "api_key_env" in errors[0][2]
    assert bind_errors([("h", host(engine, bind_address="127.0.0.1"))], monkeypatch) == []


def test_an_engine_without_coverage_data_is_refused_off_loopback():
    assert "does not know which routes" in off_loopback_problem("new-engine", "10.0.0.1", "SOME_KEY")
    assert off_loopback_problem("new-engine", "10.0.0.1", None).startswith("10.0.0.1 is not loopback: set")


def test_every_engine_has_coverage_data_with_a_source_and_a_non_v1_probe_route():
    coverage = key_coverage()
    assert set(coverage) == set(load_catalog().engines)
    for engine, cov in coverage.items():
        assert cov.source.startswith("https://"), engine
        assert not cov.probe_route.startswith("/v1") and cov.probe_route.startswith("/"), engine
        assert set(cov.open_inference_routes) <= set(cov.open_routes), engine


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llama.cpp"])
def test_the_double_keys_the_routes_its_engine_keys(engine):
    """The double's rule (what the lab runs) against the catalog's record of the real engine."""
    cov, key_free = key_coverage()[engine], DOUBLE.KEY_FREE[engine]
    assert all(key_free(route) for route in cov.open_routes)
    assert not key_free("/v1/chat/completions")
    assert key_free(cov.probe_route) == (cov.probe_route in cov.open_inference_routes)
    assert DOUBLE.NATIVE_ROUTES[engine] == cov.probe_route


@pytest.fixture()
def serve():
    servers = []

    def start(handler) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()  # a quick shutdown
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def double(serve, monkeypatch, engine: str, key: str | None = KEY) -> str:
    """The lab's engine double playing `engine`, ready at once, with `key` (None: started without one)."""
    monkeypatch.setenv("MODELFLEET_DOUBLE_LOAD_DELAY_S", "0")
    args = {"positional": ["/model"], "--served-model-name": "tiny-lab", **({"--api-key": key} if key else {})}
    eng = DOUBLE.Engine(engine, args)
    return serve(type("Handler", (DOUBLE.Handler,), {"eng": eng, "log_message": lambda *a: None}))


def post(url: str, body: dict, key: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, {}


@pytest.mark.parametrize("engine, open_without_key", [("vllm", True), ("sglang", False), ("llama.cpp", False)])
def test_the_double_serves_its_engines_native_route_keyed_as_the_engine_does(serve, monkeypatch, engine,
                                                                            open_without_key):
    url = double(serve, monkeypatch, engine)
    cov = key_coverage()[engine]
    status, reply = post(url + cov.probe_route, cov.probe_body)
    assert status == (200 if open_without_key else 401)
    status, reply = post(url + cov.probe_route, cov.probe_body, key=KEY)
    assert status == 200 and "Hello" in json.dumps(reply)
    assert post(url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})[0] == 401


def test_the_verify_stage_names_the_real_address_not_a_tunnels_end():
    report = {"scope": "readiness", "readiness": {"ok": True}, "base_url": "http://10.0.0.7:30000/v1",
              "exposure": {"ok": False, "routes": [{"route": "/v1/chat/completions", "status": 401, "refused": True},
                                                   {"route": "/generate", "status": 200, "refused": False}]}}
    assert _failures(report) == ["exposure: 10.0.0.7:30000/generate answered 200 to a request without the API "
                                 "key (want 401 or 403): the model is served to anyone who reaches it"]
