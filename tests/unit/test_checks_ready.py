"""Readiness with the standard library (checks/ready.py), against a small HTTP server on loopback that answers
as an engine does: /health, then /v1/models behind a bearer key."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from modelfleet.run.checks import Endpoint, ready


@pytest.fixture()
def engine():
    state = {"health": 200, "models": ["tiny-lab"], "key": "k-1"}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/health":
                self.send_response(state["health"])
                self.end_headers()
            elif self.path == "/v1/models":
                if self.headers.get("Authorization") != f"Bearer {state['key']}":
                    self.send_response(401)
                    self.end_headers()
                    return
                body = json.dumps({"object": "list", "data": [{"id": m} for m in state["models"]]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()  # a quick shutdown
    yield state, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def endpoint(base_url, key="k-1", model="tiny-lab"):
    return Endpoint(name="h/p", base_url=base_url, model=model, engine="vllm", api_key=key)


def test_ready_when_health_answers_and_the_models_list_names_it(engine):
    _, url = engine
    report = ready.report(endpoint(url), timeout_s=2)
    assert report["ok"] and report["scope"] == "readiness" and report["readiness"]["models"] == ["tiny-lab"]


@pytest.mark.slow
@pytest.mark.parametrize("fault, reason", [
    ({"health": 503}, "/health answered 503"),
    ({"key": "other"}, "/v1/models answered 401"),
    ({"models": ["something-else"]}, "/v1/models lists ['something-else'], not 'tiny-lab'"),
])
def test_not_ready_says_why(engine, fault, reason):
    state, url = engine
    state.update(fault)
    report = ready.report(endpoint(url), timeout_s=1)
    assert not report["ok"] and report["readiness"]["error"] == f"not ready after 1 s: {reason}"


def test_nothing_listening_is_a_reason_too():
    report = ready.report(endpoint("http://127.0.0.1:9"), timeout_s=0)
    assert not report["ok"] and "Connection refused" in report["readiness"]["error"]
