"""verify's key-less probe (checks/exposure.py) against real HTTP servers on loopback: the lab's engine double
playing each engine, a server that answers everything, one that refuses with 403, and a port nothing listens
on; which routes it asks of a replica, a front door and an engine the catalog has no key coverage for."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from modelfleet.plan.exposure import key_coverage
from modelfleet.run.checks import Endpoint, exposure
from tests.helpers.engine_on_loopback import engine_on_loopback

KEY = "k-exposure-test"


@pytest.fixture()
def answering():
    """A server on loopback that answers every POST with `status` (200 unless set), recording the routes."""
    state = {"status": 200, "routes": []}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            state["routes"].append((self.path, self.headers.get("Authorization")))
            self.send_response(state["status"])
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    yield state, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def endpoint(url: str, engine: str, key: str | None = KEY, **more) -> Endpoint:
    return Endpoint(name="h/p", base_url=url, model="tiny-lab", engine=engine, api_key=key, **more)


@pytest.mark.parametrize("engine", ["sglang", "llama.cpp"])
def test_probe_passes_where_every_route_refuses_a_keyless_request(monkeypatch, engine):
    with engine_on_loopback(monkeypatch, engine, key=KEY) as url:
        result = exposure.check(endpoint(url, engine))
    assert result["ok"], result
    assert [(r["route"], r["status"]) for r in result["routes"]] == [
        ("/v1/chat/completions", 401), (key_coverage()[engine].probe_route, 401)]


def test_probe_leaves_vllms_open_route_unasked_on_loopback_only(monkeypatch):
    with engine_on_loopback(monkeypatch, "vllm", key=KEY) as url:
        result = exposure.check(endpoint(url, "vllm"))
    assert result["ok"] and result["open_by_design_on_loopback"] == ["/invocations"]
    assert [r["route"] for r in result["routes"]] == ["/v1/chat/completions"]
    # Off loopback the same engine is asked on /invocations (the resolver never lets it get there).
    asked, unasked = exposure.routes_to_ask(endpoint("http://10.0.0.7:8000", "vllm"))
    assert [route for route, _ in asked] == ["/v1/chat/completions", "/invocations"] and unasked == []


def test_probe_fails_naming_host_port_and_route_when_the_engine_answers_without_the_key(monkeypatch):
    with engine_on_loopback(monkeypatch, "sglang") as url:  # started without its key: everything answers
        result = exposure.check(endpoint(url, "sglang"))
    where = url.removeprefix("http://")
    assert not result["ok"] and [r["status"] for r in result["routes"]] == [200, 200]
    assert result["failures"][1].startswith(f"{where}/generate answered 200 to a request without the API key")


def test_probe_fails_on_a_server_that_answers_every_route(answering):
    state, url = answering
    result = exposure.check(endpoint(url, "llama.cpp"))
    assert not result["ok"] and {r["route"] for r in result["routes"]} == {"/v1/chat/completions", "/completion"}
    assert [auth for _, auth in state["routes"]] == [None, None]  # the key is never sent


def test_a_403_is_a_refusal_as_much_as_a_401(answering):
    state, url = answering
    state["status"] = 403
    result = exposure.check(endpoint(url, "sglang"))
    assert result["ok"] and result["failures"] == [] and all(r["refused"] for r in result["routes"])


def test_a_port_nothing_listens_on_is_no_answer_not_a_pass():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        result = exposure.check(endpoint(f"http://127.0.0.1:{port}", "llama.cpp"), timeout_s=2)
    assert not result["ok"]
    assert result["routes"][0]["status"].startswith("URLError")
    assert result["failures"][0].startswith(f"127.0.0.1:{port}/v1/chat/completions: no answer to a request "
                                            "without the API key (URLError")


def test_a_front_door_is_asked_every_route_it_serves_with_a_body_each_would_run():
    door = endpoint("http://10.0.0.5:8800", "vllm", refused_routes=("/v1/chat/completions", "/v1/completions",
                                                                      "/generate"))
    asked, unasked = exposure.routes_to_ask(door)
    assert [route for route, _ in asked] == ["/v1/chat/completions", "/v1/completions", "/generate"]
    assert unasked == []
    body = dict(asked)["/v1/completions"]
    assert body["prompt"] and body["text"] and body["model"] == "tiny-lab"


def test_an_open_route_is_left_unasked_on_loopback_only():
    asked, unasked = exposure.routes_to_ask(endpoint("http://127.0.0.1:8000", "vllm"))
    assert [route for route, _ in asked] == ["/v1/chat/completions"] and unasked == ["/invocations"]
    # Off loopback (a replica on the fabric for its router too) it is asked: 200 there fails the gate.
    asked, unasked = exposure.routes_to_ask(endpoint("http://10.0.0.7:8000", "vllm"))
    assert [route for route, _ in asked] == ["/v1/chat/completions", "/invocations"] and unasked == []


def test_an_engine_without_key_coverage_is_asked_the_openai_route_only():
    asked, unasked = exposure.routes_to_ask(endpoint("http://10.0.0.7:9000", "remote"))
    assert [route for route, _ in asked] == ["/v1/chat/completions"] and unasked == []


def test_failures_through_a_tunnel_name_the_real_address(answering):
    _, url = answering
    result = exposure.check(endpoint(url, "sglang"))
    assert exposure.failures_at(result, "10.0.0.7:30000") == [
        f"10.0.0.7:30000{route} answered 200 to a request without the API key (want 401 or 403): the model is "
        "served to anyone who reaches it" for route in ("/v1/chat/completions", "/generate")]
    assert exposure.failures_at({"ok": False}, "10.0.0.7:30000") == []
