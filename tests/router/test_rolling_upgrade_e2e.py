"""A rolling image upgrade through the front door, one replica at a time, with the product's own batch steps
(modelfleet.fleet.rollout.switch_batch): the replica taken out of the router through the worker-API commands the router
stage runs (fleet_status.front_doors, run on the router host: `@local` here), its switch (stopped, started on the new
version, ready, and the verify gate as the serve stage runs it), then put back into the router. Client threads
keep sending chat requests through the front door meanwhile; every failed one is counted (the goal: none), and
afterwards every replica answers with the new version. Then one replica dies: the router's health check takes it
out, and `modelfleet status` says so.

The replicas are the inventory's (modelfleet.plan.inventory.resolve): one on the router host itself (loopback), two on
hosts b and c at their fabric addresses (127.0.0.2 and 127.0.0.3, loopback too on Linux). Where the lab's real
llama-server image is in the machine's dockerd (lab.llama_server_image()), it serves c's URL: the router sees a URL
that answers /health and the OpenAI routes; its new version is a new model revision (another GGUF, which its
/props names). What the rollout runs with pyinfra (the prefetch, the serve deploy that restarts the unit) is the
switch this test plays with processes.
"""

from __future__ import annotations

import json
import subprocess
import time
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

import lab
from lab.tiny_gguf import write as write_gguf
from modelfleet.fleet import status as fleet_status
from modelfleet.fleet.rollout import batches, switch_batch
from modelfleet.plan import router
from modelfleet.plan.inventory import resolve
from modelfleet.run.checks import endpoint
from modelfleet.run.checks.gate import run_gate
from tests.router.front_door import (
    KEY,
    SERVED,
    Clients,
    Replica,
    free_base_port,
    http,
    listed,
    start_front_door,
    stop_all,
    wait_for,
)

OLD, NEW = "0.34.0", "0.35.0"
KEY_ENV = "MF_ROLLING_E2E_KEY"
LLAMA_HOST = "c"


def llama_server_missing() -> str | None:
    """Why the real llama-server cannot serve a replica here (None: it can)."""
    try:
        daemon = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
        image = subprocess.run(["docker", "image", "inspect", lab.llama_server_image()], capture_output=True,
                               text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"no docker here ({error})"
    if daemon.returncode:
        return f"the machine's dockerd does not answer ({daemon.stderr.strip()[-200:]}); `make lab-setup` starts it"
    if image.returncode:
        return f"the lab's llama-server image {lab.llama_server_image()} is not in the machine's dockerd " \
               "(lab/build-llama-server.sh builds it)"
    return None


SEED = 7


class LlamaServer:
    """The lab's real llama-server (Debian's build, in its lab image) on the host network, at a replica's URL."""

    def __init__(self, workdir: Path, address: str, port: int, revision: str):
        self.url, self.revision = f"http://{address}:{port}", revision
        self.name = f"modelfleet-router-e2e-{address.replace('.', '-')}-{port}-{revision}"
        self.model = f"/models/{revision}/tiny.gguf"
        subprocess.run(["docker", "rm", "-f", self.name], capture_output=True)
        run = subprocess.run(["docker", "run", "-d", "--rm", "--network", "host", "--name", self.name, "-v",
                              f"{workdir / 'models'}:/models:ro", "--entrypoint", "/app/llama-server",
                              lab.llama_server_image(), "--model", self.model, "--alias", SERVED, "--host", address,
                              "--port", str(port), "--ctx-size", "4096", "--jinja", "--metrics", "--api-key", KEY,
                              # One sampling seed: the random weights' answers are the same every run. A free
                              # seed once drew a tool call whose arguments llama-server's own JSON parser refused
                              # (a lone \uD8xx escape), failing the gate on noise rather than on the rollout.
                              "--seed", str(SEED)],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, f"docker run {self.name}: {run.stderr.strip()[-500:]}"
        wait_for(lambda: http("GET", f"{self.url}/health", timeout=2)[0] == 200, 60, f"llama-server {self.url}")

    def version(self) -> str:
        """The model revision it loaded, from its /props."""
        props = json.loads(http("GET", f"{self.url}/props", key=KEY)[1])
        return props["model_path"].split("/")[-2]

    def stop(self):
        subprocess.run(["docker", "stop", "-t", "10", self.name], capture_output=True, timeout=60)


def replica_settings(engine: str, port: int, router_port: int, **more) -> dict:
    return {"hardware": "lab-cpu", "model": SERVED, "engine": engine, "recipe": f"tiny-lab-{engine}",
            "pool": f"p{port}", "port": port, "router": "@local", "router_bind_address": "127.0.0.1",
            "router_port": router_port, "router_policy": "round_robin", "api_key_env": KEY_ENV, **more}


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_rolling_upgrade_behind_the_front_door_fails_no_client_request(engine, tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    router_port = free_base_port(3)
    resolved = resolve([
        ("@local", replica_settings(engine, free_base_port(1), router_port, config_dir=str(tmp_path))),
        ("b", replica_settings(engine, free_base_port(1), router_port, fabric_address="127.0.0.2")),
        ("c", replica_settings(engine, free_base_port(1), router_port, fabric_address="127.0.0.3"))])
    assert not resolved.errors, resolved.errors
    rp = resolved.routers[SERVED]
    assert len(rp.workers) == 3 and router.spec(rp).package
    missing = llama_server_missing()
    if missing:
        warnings.warn(f"replica {LLAMA_HOST} is an engine double, not the real llama-server: {missing}",
                      stacklevel=1)
    else:
        for revision, seed in ((OLD, 0), (NEW, 1)):
            (tmp_path / "models" / revision).mkdir(parents=True)
            write_gguf(tmp_path / "models" / revision / "tiny.gguf", seed=seed)

    def start(host: str, version: str):
        svc = resolved.hosts[host].services[0]
        address = svc.bind_address
        if host == LLAMA_HOST and not missing:
            return LlamaServer(tmp_path, address, svc.port, version)
        return Replica(engine, tmp_path, svc.port, address=address, port=svc.port, version=version)

    def gate_endpoint(host: str):
        """The verify gate's view of the replica, as the serve stage builds it (llama-server's probe settings
        where it serves: the tiny random GGUF calls a tool only when told to)."""
        plan = resolved.hosts[host]
        ep = endpoint(plan, plan.services[0])
        if host == LLAMA_HOST and not missing:
            ep = replace(ep, engine="llama.cpp", tool_choice="required", final_tool_choice="none")
        return ep

    replicas = {host: start(host, OLD) for host in resolved.hosts}
    procs, steps, gates = [], [], {}
    try:
        procs = start_front_door(rp, tmp_path)
        wait_for(lambda: set(listed(rp)) == {w.url for w in rp.workers}, 60, "the router lists the three replicas")
        wait_for(lambda: http("POST", f"{rp.base_url}/v1/chat/completions", {"model": SERVED, "messages": [
            {"role": "user", "content": "hi"}]}, KEY)[0] == 200, 30, "a chat through the front door")

        def switch(host: str):
            def run() -> tuple[bool, str]:
                replicas[host].stop()
                replicas[host] = start(host, NEW)
                report = run_gate(gate_endpoint(host), 60, True, None, tmp_path)
                gates[host] = report["ok"]
                return report["ok"], json.dumps({k: report.get(k) for k in ("readiness", "smoke", "tool_probe")})
            return run

        order = batches(resolved, 1)
        assert order == [["@local"], ["b"], ["c"]]
        with Clients(rp.base_url) as clients:
            time.sleep(2)
            for batch in order:
                url = next(w.url for w in rp.workers if w.host in batch)
                started = time.time()
                outcome = switch_batch(resolved, batch, switch(batch[0]), log=lambda line: None,
                                       step=lambda name, url=url: steps.append((name, url in listed(rp))))
                assert outcome == ("upgraded", None), outcome
                steps.append(("seconds", round(time.time() - started, 1)))
                time.sleep(2)
        assert gates == dict.fromkeys(resolved.hosts, True)
        # Out of the router before the switch stopped it; back in once it passed its gate.
        assert [s for s in steps if s[0] != "seconds"] == [("front door", True), ("switch", False),
                                                           ("front door", False)] * 3, steps
        total = clients.ok + len(clients.failed)
        print(f"\n{router.spec(rp).package} {router.spec(rp).version}: rolling upgrade {OLD} -> {NEW} of "
              f"{', '.join(f'{h} ({type(r).__name__})' for h, r in replicas.items())}: {total} chat requests "
              f"through the front door, {len(clients.failed)} failed; seconds per replica: "
              f"{[s[1] for s in steps if s[0] == 'seconds']}")
        assert clients.ok >= 100, clients.ok
        assert clients.failed == [], f"{len(clients.failed)} of {total} failed: {clients.failed[:5]}"
        assert procs[0].poll() is None, "the router restarted or died"
        assert set(listed(rp)) == {w.url for w in rp.workers}

        # Every replica runs the new version: asked directly, and through the front door.
        for host, replica in replicas.items():
            if isinstance(replica, LlamaServer):
                assert replica.version() == NEW
                continue
            status, raw = http("POST", f"{replica.url}/v1/chat/completions", {"model": SERVED, "messages": [
                {"role": "user", "content": "hi"}]}, KEY)
            assert status == 200 and json.loads(raw)["system_fingerprint"] == NEW, (host, status, raw[:300])
        seen = set()
        for _ in range(12):
            status, raw = http("POST", f"{rp.base_url}/v1/chat/completions", {"model": SERVED, "messages": [
                {"role": "user", "content": "hi"}], "max_tokens": 4}, KEY)
            assert status == 200, raw[:300]
            seen.add(json.loads(raw).get("system_fingerprint"))
        assert OLD not in seen and NEW in seen, seen

        # The router host's own replica dies: the router's health check takes it out, and `modelfleet status`
        # (run on the router host, @local) says so.
        here = resolved.hosts["@local"]
        dead = next(w.url for w in rp.workers if w.host == "@local")
        replicas["@local"].stop()
        wait_for(lambda: listed(rp)[dead]["healthy"] is False, 3 * router.HEALTH_INTERVAL_S * 2 + 10,
                 "the router's health check marks the dead replica unhealthy")
        row = fleet_status.status([here])[0]
        assert row["reachable"] and [s["router"] for s in row["services"]] == ["unhealthy"], row
        table = fleet_status.status_table([row])
        assert "unhealthy" in table and "(plain HTTP; 2/3 replicas healthy)" in table, table
    finally:
        stop_all(procs)
        for replica in replicas.values():
            replica.stop()
