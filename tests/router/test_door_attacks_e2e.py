"""The front door as an attacker meets it: Debian's nginx started from the product's own config and key file
(modelfleet.plan.router) in front of a vLLM engine double (which, like vLLM, runs /invocations without its key).
Each test asserts on what the attacker got back."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from modelfleet.plan import router
from modelfleet.plan.inventory.plan import RouterPlan, Worker
from tests.router.front_door import Replica, free_base_port, http, nginx_binary, sh, stop_all, wait_for

pytestmark = pytest.mark.slow
# Every character the proxy's config can hold that a regular expression would read: `.` and `+`.
KEY = "Door.Key+exact-7f3a"
CHAT = {"model": "tiny-lab", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _door(tmp_path: Path, backend_port: int, key: str = KEY) -> tuple[RouterPlan, subprocess.Popen]:
    """nginx as the router stage writes it, its backend (the router's port) played by whatever listens on
    `backend_port`."""
    port = backend_port - 1
    rp = RouterPlan(name="tiny-lab", host="local", engine_name="vllm", served_name="tiny-lab",
                    bind_address="127.0.0.1", port=port, policy="round_robin", api_key_env="UNUSED",
                    config_dir=str(tmp_path), workers=(Worker("r0", "local", f"http://127.0.0.1:{backend_port}"),))
    proc = _nginx(rp, tmp_path, key)
    wait_for(lambda: http("GET", f"{rp.base_url}/health", timeout=2)[0] == 200, 20, "nginx answers /health")
    return rp, proc


def _nginx(rp: RouterPlan, tmp_path: Path, key: str) -> subprocess.Popen:
    """nginx started from the files the router stage writes for `rp` (its TLS files too, where it has them)."""
    sh(router.users_script())  # its workers' user, as the stage makes it
    paths, runtime = router.paths(rp), tmp_path / "door"
    runtime.mkdir()
    for path, content in router.tls_files(rp).items():
        Path(path).write_text(content)
    Path(paths["proxy_key"]).write_text(router.proxy_key_conf(key))
    Path(paths["proxy"]).write_text(router.render_proxy(rp, runtime=str(runtime)))
    conf = ["-e", "stderr", "-p", str(runtime), "-c", paths["proxy"]]
    nginx = nginx_binary()
    sh(f"{nginx} -t -q {' '.join(conf)}")
    return subprocess.Popen([str(nginx), *conf], stdout=(tmp_path / "nginx.log").open("w"), stderr=subprocess.STDOUT)


def test_the_front_door_takes_the_key_exactly_and_nothing_like_it(tmp_path, monkeypatch):
    base = free_base_port(2)
    # The backend: a vLLM double whose /invocations is open without its key, as vLLM's is.
    engine = Replica("vllm", tmp_path, 0, port=base + 1, key=KEY)
    rp, proc = _door(tmp_path, base + 1)
    try:
        body = {"prompt": "Say hi.", "max_tokens": 2}
        assert http("POST", f"{engine.url}/invocations", body)[0] == 200  # the hole the door covers
        near = [None, KEY.lower(), KEY.upper(), KEY.swapcase(), KEY + "x", "x" + KEY, KEY[:-1],
                KEY.replace(".", "a"), KEY.replace("+", "a"), KEY.replace("+", "++"), f"{KEY} {KEY}"]
        got = {repr(k): [http("POST", f"{rp.base_url}{route}", CHAT if route.startswith("/v1") else body, k)[0]
                         for route in ("/v1/chat/completions", "/invocations")] for k in near}
        assert all(codes == [401, 401] for codes in got.values()), got
        # Whatever the header's spelling of the scheme, only `Bearer <key>` exactly passes.
        for header in (f"bearer {KEY}", f"BEARER {KEY}", f"Bearer  {KEY}", KEY):
            status = _raw(rp.base_url + "/invocations", header)
            assert status == 401, (header.replace(KEY, "<key>"), status)
        assert http("POST", f"{rp.base_url}/invocations", body, KEY)[0] == 200
        assert http("POST", f"{rp.base_url}/v1/chat/completions", CHAT, KEY)[0] == 200
    finally:
        stop_all([proc])
        engine.stop()


def _get(base_url: str, path: str, key: str | None = None, method: str = "GET") -> tuple[int, bytes]:
    """`path` sent exactly as written (no client library normalises it), as an attacker's raw request."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(base_url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=10)
    try:
        conn.request(method, path, headers={"Authorization": f"Bearer {key}"} if key else {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


class _MountedMetrics:
    """A backend that, as vLLM's Prometheus app mounted at /metrics does, answers every path under /metrics
    (`/metrics/../health` included: the path is not normalised) with its metrics, and /health with nothing."""

    def __init__(self, port: int):
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = b"vllm:num_requests_running 0\n" if self.path.startswith("/metrics") else b""
                self.send_response(200 if body or self.path == "/health" else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()


def test_the_key_free_health_route_is_the_exact_path_and_nothing_nginx_would_normalise_to_it(tmp_path):
    """Paths that nginx normalises to /health but the backend reads otherwise (its metrics, mounted under
    /metrics) get 401 without the key, never the backend's metrics; /health itself stays open."""
    base = free_base_port(2)
    engine = _MountedMetrics(base + 1)
    rp, proc = _door(tmp_path, base + 1)
    try:
        assert b"vllm:" in _get(engine.url, "/metrics/../health")[1]  # what the backend hands out
        assert _get(rp.base_url, "/health")[0] == 200
        for path in ("/metrics/../health", "/metrics/%2e%2e/health", "//health", "/%68ealth", "/x/../health",
                     "/metrics", "/metrics?x=/health"):
            status, body = _get(rp.base_url, path)
            assert (status, b"vllm:" in body) == (401, False), (path, status, body[:200])
    finally:
        stop_all([proc])
        engine.stop()


def test_a_client_key_opens_the_model_routes_and_no_admin_route_of_the_router(tmp_path):
    """The real vllm-router behind its door: a client holding the key asks the router's admin routes (worker
    API, cache flush, loads) and routes its fallback would pass to an engine: 403 each, the router untouched;
    the same path reached by normalisation is refused too. The model's routes still answer."""
    from tests.router.front_door import KEY as MODEL_KEY
    from tests.router.front_door import SERVED, listed, start_front_door

    replica, intruder = Replica("vllm", tmp_path, 0), Replica("vllm", tmp_path, 9)
    rp = RouterPlan(name=SERVED, host="local", engine_name="vllm", served_name=SERVED, bind_address="127.0.0.1",
                    port=free_base_port(3), policy="round_robin", api_key_env="UNUSED", config_dir=str(tmp_path),
                    workers=(Worker("r0", "local", replica.url),))
    procs = start_front_door(rp, tmp_path)
    try:
        wait_for(lambda: set(listed(rp)) == {replica.url}, 60, "the router lists its replica")
        backend = router.local_url(rp)
        # What the key opened before: the router's admin routes answer whoever reaches them (flush_cache asks the
        # replicas, which the double does not know: 500, from the handler).
        assert [_get(backend, "/workers")[0], _get(backend, "/flush_cache", method="POST")[0]] == [200, 500]
        got = {(method, path): _get(rp.base_url, path, MODEL_KEY, method)[0] for method, path in (
            ("POST", "/flush_cache"), ("GET", "/get_loads"), ("GET", "/workers"), ("GET", "/list_workers"),
            ("POST", f"/add_worker?url={intruder.url}"), ("POST", f"/workers?url={intruder.url}"),
            ("POST", f"/v1/../add_worker?url={intruder.url}"), ("GET", "/get_server_info"),
            ("POST", "/pause"), ("POST", "/update_weights"), ("POST", "/v1/chat/completions/../../flush_cache"))}
        assert set(got.values()) == {403}, got
        assert set(listed(rp)) == {replica.url} and intruder.served() == 0
        chat = {**CHAT, "model": SERVED}
        assert http("POST", f"{rp.base_url}/v1/chat/completions", chat, MODEL_KEY)[0] == 200
        assert http("GET", f"{rp.base_url}/v1/models", None, MODEL_KEY)[0] == 200
        assert http("POST", f"{rp.base_url}/flush_cache", {})[0] == 401  # without the key: nothing said
    finally:
        stop_all(procs)
        replica.stop()
        intruder.stop()


def _raw(url: str, authorization: str) -> int:
    import urllib.error
    import urllib.request
    request = urllib.request.Request(url, data=b'{"prompt": "hi", "max_tokens": 1}', method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": authorization})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_the_gate_asks_each_replica_from_the_router_host_and_fails_on_an_open_model_route(tmp_path):
    """What the router stage runs on the router host (router.replica_exposure_script), against real doubles:
    vLLM's /invocations answers without the key (the attack succeeds: the gate fails naming host and route);
    SGLang's replica refuses every route (the gate passes)."""
    from modelfleet.base.host_commands import program

    vllm, sglang = Replica("vllm", tmp_path, 0), Replica("sglang", tmp_path, 1)
    try:
        rp = RouterPlan(name="tiny-lab", host="r1", engine_name="vllm", served_name="tiny-lab",
                        bind_address="10.0.0.1", port=8800, policy="round_robin", api_key_env="UNUSED",
                        config_dir="/etc/modelfleet", workers=(Worker("p", "gpu-2", "http://10.1.0.2:8000"),))
        # The script the stage runs names this replica's routes; here it is pointed at the doubles instead.
        assert "http://10.1.0.2:8000/invocations" in router.replica_exposure_script(rp)
        body = '{"model": "tiny-lab", "messages": [{"role": "user", "content": "hi"}], "prompt": "hi", ' \
               '"text": "hi", "max_tokens": 1}'
        attacker = subprocess.run(program("replica_exposure", "tiny-lab", body, "gpu-2", f"{vllm.url}/invocations",
                                          "gpu-2", f"{vllm.url}/v1/chat/completions"), shell=True,
                                  capture_output=True, text=True)
        assert attacker.returncode == 1
        assert attacker.stderr.strip() == (f"modelfleet: front door tiny-lab: replica on gpu-2 answered 200 at "
                                           f"{vllm.url}/invocations to a request without the key, from the router "
                                           "host (want 401 or 403): the model runs for anyone who reaches it")
        assert attacker.stdout.strip() == f"refused 401 gpu-2 {vllm.url}/v1/chat/completions"
        keyed = subprocess.run(program("replica_exposure", "tiny-lab", body, "gpu-3", f"{sglang.url}/generate",
                                       "gpu-3", f"{sglang.url}/v1/chat/completions"), shell=True,
                               capture_output=True, text=True)
        assert keyed.returncode == 0 and keyed.stderr == "", keyed.stderr
        gone = subprocess.run(program("replica_exposure", "tiny-lab", body, "gpu-4", "http://127.0.0.1:9/x"),
                              shell=True, capture_output=True, text=True)
        assert gone.returncode == 1 and "replica on gpu-4 gave no answer" in gone.stderr
    finally:
        vllm.stop()
        sglang.stop()


def test_a_client_or_local_process_cannot_register_a_worker_with_sglangs_router(tmp_path):
    """The real sglang-router as the stage starts it: its worker API takes only the key modelfleet made on the
    router host. An attacker holding the clients' key (or none) posts its own worker: refused, never listed, and
    it receives none of the clients' requests; modelfleet's own registration still works."""
    from tests.router.front_door import KEY, SERVED, Clients, listed, start_front_door

    replicas = [Replica("sglang", tmp_path, i) for i in range(2)]
    rp = RouterPlan(name=SERVED, host="local", engine_name="sglang", served_name=SERVED, bind_address="127.0.0.1",
                    port=free_base_port(3), policy="round_robin", api_key_env="UNUSED", config_dir=str(tmp_path),
                    workers=tuple(Worker(f"r{i}", "local", r.url) for i, r in enumerate(replicas)))
    procs = start_front_door(rp, tmp_path)
    attacker_worker = Replica("sglang", tmp_path, 9)
    try:
        wait_for(lambda: set(listed(rp)) == {r.url for r in replicas}, 60, "the router lists its replicas")
        admin = Path(router.paths(rp)["admin"])
        assert admin.stat().st_mode & 0o777 == 0o600 and len(admin.read_text().strip()) == 64
        assert admin.read_text().strip().encode() not in Path(f"/proc/{procs[0].pid}/cmdline").read_bytes()
        body = {"url": attacker_worker.url, "model_id": SERVED}
        got = [http("POST", f"{rp.base_url}/workers", body, key)[0] for key in (None, KEY, KEY.upper())]
        assert got == [401, 401, 401], got
        with Clients(rp.base_url) as clients:
            time.sleep(4)
        assert clients.ok >= 20 and clients.failed == []
        assert attacker_worker.url not in listed(rp) and attacker_worker.served() == 0
        # modelfleet's own call (the stage's script, with the host's key file) is taken.
        sh(router.add_script(rp, attacker_worker.url))
        assert attacker_worker.url in listed(rp)
    finally:
        stop_all(procs)
        for replica in [*replicas, attacker_worker]:
            replica.stop()


def test_a_tls_front_door_serves_only_https_with_the_sites_certificate(tmp_path):
    """nginx with a certificate and key as the stage writes them: a client that trusts the certificate gets the
    model with the key; the same request in plain HTTP, or to a client that does not trust it, gets nothing;
    the verify gate (pinned to the certificate) passes through it."""
    import ssl

    from modelfleet.run.checks import exposure
    from modelfleet.run.checks.gate import run_gate
    from modelfleet.run.stages.router import front_door_endpoint

    cert, key = tmp_path / "site.crt", tmp_path / "site.key"
    sh(f"openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=door.lab -addext "
       f"subjectAltName=DNS:door.lab,IP:127.0.0.1 -keyout {key} -out {cert} 2>/dev/null")
    base = free_base_port(2)
    engine = Replica("vllm", tmp_path, 0, port=base + 1, key=KEY)
    port = base
    rp = RouterPlan(name="tiny-lab", host="local", engine_name="vllm", served_name="tiny-lab",
                    bind_address="127.0.0.1", port=port, policy="round_robin", api_key_env="UNUSED",
                    config_dir=str(tmp_path), workers=(Worker("r0", "local", engine.url),), tls_cert=str(cert),
                    tls_key=str(key))
    proc = _nginx(rp, tmp_path, KEY)
    try:
        assert rp.base_url == f"https://127.0.0.1:{port}"
        trusting = ssl.create_default_context(cafile=str(cert))
        wait_for(lambda: _https(f"{rp.base_url}/health", trusting)[0] == 200, 20, "nginx answers over TLS")
        assert _https(f"{rp.base_url}/v1/chat/completions", trusting, CHAT, KEY)[0] == 200
        assert _https(f"{rp.base_url}/invocations", trusting, {"prompt": "hi", "max_tokens": 1})[0] == 401
        # The key sent in clear to the TLS port is not taken: nginx answers 400 and never reaches the model.
        status, raw = http("POST", f"http://127.0.0.1:{port}/v1/chat/completions", CHAT, KEY)
        assert status == 400 and b"tiny-lab" not in raw, (status, raw[:200])
        # A client that does not trust the site's certificate does not talk to the door at all.
        with pytest.raises(OSError, match="CERTIFICATE_VERIFY_FAILED"):
            _https(f"{rp.base_url}/health", ssl.create_default_context())
        # TLS 1.2 only with forward secrecy: a client offering only static-RSA key exchange, or TLS 1.1, gets no
        # session; an ECDHE one does.
        def handshake(*args: str) -> str:
            done = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-CAfile", str(cert),
                                   *args], input="", capture_output=True, text=True, timeout=30)
            return done.stdout if done.returncode == 0 else "refused"
        for weak in ("AES128-GCM-SHA256", "AES256-GCM-SHA384", "AES128-SHA256", "AES128-SHA"):
            assert handshake("-tls1_2", "-cipher", weak) == "refused", weak
        assert handshake("-tls1_1", "-cipher", "ALL:@SECLEVEL=0") == "refused"
        assert "Cipher is ECDHE-RSA-AES128-GCM-SHA256" in handshake("-tls1_2", "-cipher", "ECDHE-RSA-AES128-GCM-SHA256")
        ep = front_door_endpoint(rp, KEY)
        report = run_gate(ep, 20, True, None, tmp_path)
        assert report["readiness"]["ok"] and report["smoke"]["ok"], json.dumps(report)[:2000]
        refused = exposure.check(ep)
        assert refused["ok"] and {r["status"] for r in refused["routes"]} == {401}, refused
    finally:
        stop_all([proc])
        engine.stop()


def _https(url: str, context, body: dict | None = None, key: str | None = None) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request
    request = urllib.request.Request(url, data=json.dumps(body).encode() if body else None,
                                     method="POST" if body else "GET", headers={"Content-Type": "application/json"})
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_a_vllm_replica_on_another_host_is_reached_only_through_its_keyed_proxy(tmp_path):
    """The real vllm-router behind its front door, its replica (a vLLM double, /invocations open without the key)
    on "another host": the engine on loopback and the replica's keyed proxy (nginx, modelfleet.plan.replica_door) on
    that host's fabric address (127.0.0.2 here). An attacker on the fabric asks the replica's model routes without
    the key, or with a near one: refused; a client through the front door gets the model."""
    from dataclasses import replace as with_

    from modelfleet.base.host_commands import program
    from modelfleet.plan import replica_door
    from modelfleet.plan.inventory import resolve
    from tests.router.front_door import KEY as MODEL_KEY
    from tests.router.front_door import SERVED, listed, start_front_door

    port = free_base_port(1)
    engine = Replica("vllm", tmp_path, 0, address="127.0.0.1", port=port)
    entries = [(n, {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm",
                    "ssh_hostname": a, "fabric_address": f, "router": "r1", "api_key_env": "UNUSED"})
               for n, a, f in (("r1", "10.0.0.1", "10.1.0.1"), ("a", "10.0.0.2", "10.1.0.2"))]
    svc = with_(resolve(entries, offline=True).hosts["a"].services[0], door_address="127.0.0.2", port=port,
                config_dir=str(tmp_path))
    runtime = tmp_path / "replica-door"
    runtime.mkdir()
    for path, content, _, _ in replica_door.files(svc, MODEL_KEY):
        if path.startswith(str(tmp_path)):
            Path(path).write_text(content)
    conf = replica_door.paths(svc)["conf"]
    Path(conf).write_text(replica_door.render_conf(svc, runtime=str(runtime)))
    nginx = nginx_binary()
    door = subprocess.Popen([str(nginx), "-e", "stderr", "-p", str(runtime), "-c", conf],
                            stdout=(tmp_path / "replica-door.log").open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.2:{port}"
    rp = RouterPlan(name=SERVED, host="r1", engine_name="vllm", served_name=SERVED, bind_address="127.0.0.1",
                    port=free_base_port(3), policy="round_robin", api_key_env="UNUSED", config_dir=str(tmp_path),
                    workers=(Worker("a", "a", url),))
    procs = []
    try:
        wait_for(lambda: http("GET", f"{url}/health", timeout=2)[0] == 200, 20, "the replica's proxy answers")
        procs = start_front_door(rp, tmp_path)
        body = {"model": SERVED, "prompt": "Say hi.", "max_tokens": 2}
        # The hole the proxy covers: on the replica host's loopback the engine runs /invocations for anyone.
        assert http("POST", f"{engine.url}/invocations", body)[0] == 200
        attacker = {(route, k): http("POST", f"{url}{route}", CHAT if route.startswith("/v1") else body, k)[0]
                    for route in ("/invocations", "/pooling", "/score", "/v1/chat/completions")
                    for k in (None, MODEL_KEY.upper(), MODEL_KEY + "x")}
        assert set(attacker.values()) == {401}, attacker
        # Clients through the front door: the router reaches the replica through its proxy with the key.
        wait_for(lambda: listed(rp).get(url, {}).get("healthy") is True, 60, "the router sees the replica healthy")
        chat = {**CHAT, "model": SERVED}
        assert http("POST", f"{rp.base_url}/v1/chat/completions", chat, MODEL_KEY)[0] == 200
        assert http("POST", f"{rp.base_url}/invocations", body, MODEL_KEY)[0] == 200
        assert http("POST", f"{rp.base_url}/invocations", body)[0] == 401
        # The gate's probe from the router host, as the stage runs it: every route refused.
        script = program("replica_exposure", SERVED, '{"prompt": "hi", "max_tokens": 1}',
                         *(part for route in ("/invocations", "/pooling", "/v1/chat/completions")
                           for part in ("a", f"{url}{route}")))
        gate = subprocess.run(script, shell=True, capture_output=True, text=True)
        assert gate.returncode == 0 and gate.stdout.count("refused 401") == 3, gate.stdout + gate.stderr
    finally:
        stop_all([*procs, door])
        engine.stop()


def test_a_replicas_keyed_proxy_opens_only_the_exact_health_path(tmp_path):
    """The keyed proxy before a replica (modelfleet.plan.replica_door), in front of a backend that, as vLLM's metrics
    app does, answers every path under /metrics: what nginx normalises to the health path gets 401 without the
    key, never the metrics; the health path itself stays open, and the key opens the rest."""
    from dataclasses import replace as with_

    from modelfleet.plan import replica_door
    from modelfleet.plan.inventory import resolve

    port = free_base_port(1)
    engine = _MountedMetrics(port)
    entries = [(n, {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm",
                    "ssh_hostname": a, "fabric_address": f, "router": "r1", "api_key_env": "UNUSED"})
               for n, a, f in (("r1", "10.0.0.1", "10.1.0.1"), ("a", "10.0.0.2", "10.1.0.2"))]
    svc = with_(resolve(entries, offline=True).hosts["a"].services[0], door_address="127.0.0.2", port=port,
                config_dir=str(tmp_path))
    runtime = tmp_path / "replica-door"
    runtime.mkdir()
    for path, content, _, _ in replica_door.files(svc, KEY):
        if path.startswith(str(tmp_path)):
            Path(path).write_text(content)
    conf = replica_door.paths(svc)["conf"]
    Path(conf).write_text(replica_door.render_conf(svc, runtime=str(runtime)))
    door = subprocess.Popen([str(nginx_binary()), "-e", "stderr", "-p", str(runtime), "-c", conf],
                            stdout=(tmp_path / "replica-door.log").open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.2:{port}"
    try:
        wait_for(lambda: http("GET", f"{url}/health", timeout=2)[0] == 200, 20, "the replica's proxy answers")
        assert b"vllm:" in _get(engine.url, "/metrics/../health")[1]  # what the backend hands out
        for path in ("/metrics/../health", "/metrics/%2e%2e/health", "//health", "/%68ealth", "/x/../health",
                     "/metrics", "/metrics?x=/health"):
            status, body = _get(url, path)
            assert (status, b"vllm:" in body) == (401, False), (path, status, body[:200])
        assert _get(url, "/health")[0] == 200 and _get(url, "/health?probe=1")[0] == 404  # the backend's answer
        assert b"vllm:" in _get(url, "/metrics", KEY)[1]
    finally:
        stop_all([door])
        engine.stop()
