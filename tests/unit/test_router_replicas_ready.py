"""A front door is ready only when every replica it routes to is (SGLang #33740: the router answers /health
before its workers): router.replicas_ready_script run for real, against replicas that are ready, become ready
while it waits, or never do."""

import http.server
import subprocess
import threading
import time
from dataclasses import replace

import pytest

from modelfleet.plan import router
from modelfleet.plan.inventory import resolve
from modelfleet.plan.inventory.plan import Worker
from tests.helpers.front_doors import KEY, fleet


class Replica(http.server.BaseHTTPRequestHandler):
    ready_at: float = 0.0

    def do_GET(self):  # noqa: N802 (http.server's name)
        code = 200 if self.path == "/health" and time.monotonic() >= self.ready_at else 503
        self.send_response(code)
        self.end_headers()

    def log_message(self, *args):
        pass


def serve(ready_at: float):
    handler = type("R", (Replica,), {"ready_at": ready_at})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def replicas():
    now = time.monotonic()
    servers = {"gpu-1": serve(now), "gpu-2": serve(now + 1.5), "gpu-3": serve(now + 3600)}
    yield {name: f"http://127.0.0.1:{s.server_address[1]}" for name, s in servers.items()}
    for s in servers.values():
        s.shutdown()


def door(monkeypatch, urls: dict[str, str]):
    monkeypatch.setenv("MF_ROUTER_KEY", KEY)
    rp = resolve(fleet("vllm")).routers["tiny-lab"]
    return replace(rp, workers=tuple(Worker(f"p{i}", name, url) for i, (name, url) in enumerate(urls.items())))


@pytest.mark.slow  # waits out a timeout
def test_the_door_waits_for_a_replica_that_becomes_ready_and_names_one_that_never_does(monkeypatch, replicas):
    started = time.monotonic()
    ok = subprocess.run(router.replicas_ready_script(door(monkeypatch, {k: replicas[k] for k in ("gpu-1", "gpu-2")}),
                                                     timeout_s=10), shell=True, capture_output=True, text=True)
    assert ok.returncode == 0 and 1.0 < time.monotonic() - started < 8, ok.stderr
    assert sorted(line.split()[1] for line in ok.stdout.splitlines()) == ["gpu-1", "gpu-2"]
    bad = subprocess.run(router.replicas_ready_script(door(monkeypatch, replicas), timeout_s=3), shell=True,
                         capture_output=True, text=True)
    assert bad.returncode == 1
    assert bad.stderr.strip() == (f"modelfleet: front door tiny-lab degraded: replicas not ready after 3 s: gpu-3 "
                                  f"({replicas['gpu-3']}/health answered 503)")
    gone = replicas["gpu-3"].rsplit(":", 1)[0] + ":9"  # nothing listens: no answer at all
    none = subprocess.run(router.replicas_ready_script(door(monkeypatch, {"gpu-9": gone}), timeout_s=1), shell=True,
                          capture_output=True, text=True)
    assert none.returncode == 1 and f"gpu-9 ({gone}/health answered nothing)" in none.stderr
