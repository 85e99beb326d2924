"""The real router binary (its PyPI wheel, in a venv built once in the cache outside the checkout) in front of
engine doubles started as plain processes on loopback: while clients keep sending chat requests through the
front door, a fourth replica is added and one removed through the router's worker API, with the commands the
router stage runs; every failed client request is counted (the goal: none). A key-less request to every
inference route of the front door must be refused. vLLM's router sits behind nginx (Debian's package,
unpacked into the cache), as the stage runs it; SGLang's checks the key itself.

Started with the product's own launcher, launcher config, worker-API scripts and nginx config
(modelfleet.plan.router); only the paths are this test's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from modelfleet.plan import router
from modelfleet.plan.inventory.plan import RouterPlan, Worker
from modelfleet.run.checks import exposure
from modelfleet.run.checks.gate import run_gate
from modelfleet.run.stages.router import front_door_endpoint
from tests.router.front_door import (
    KEY,
    SERVED,
    Clients,
    Replica,
    free_base_port,
    http,
    listed,
    sh,
    start_front_door,
    stop_all,
    wait_for,
)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_replicas_join_and_leave_the_front_door_with_no_failed_request(engine, tmp_path):
    spec = router.specs()[engine]
    replicas = [Replica(engine, tmp_path, i) for i in range(3)]
    procs = []
    try:
        rp = RouterPlan(name=SERVED, host="local", engine_name=engine, served_name=SERVED, bind_address="127.0.0.1",
                        port=free_base_port(3), policy="round_robin", api_key_env="UNUSED",
                        config_dir=str(tmp_path), workers=tuple(Worker(f"r{i}", "local", r.url)
                                                                for i, r in enumerate(replicas)))
        procs = start_front_door(rp, tmp_path)
        router_proc, nginx = procs[0], len(procs) > 1
        front = rp.base_url

        wait_for(lambda: set(listed(rp)) == {r.url for r in replicas}, 60, "the router lists the three replicas")
        # The key reached the router in-process: not in its command line, nor in its environment.
        for part in ("cmdline", "environ"):
            assert KEY.encode() not in Path(f"/proc/{router_proc.pid}/{part}").read_bytes(), part
        wait_for(lambda: http("POST", f"{front}/v1/chat/completions", {"model": SERVED, "messages": [
            {"role": "user", "content": "hi"}]}, KEY)[0] == 200, 30, "a chat through the front door")

        with Clients(front) as clients:
            time.sleep(2)
            fourth = Replica(engine, tmp_path, 3)
            replicas.append(fourth)
            sh(router.add_script(rp, fourth.url))
            wait_for(lambda: fourth.served() >= 5, 30, "the added replica serves chats")
            gone = replicas[0]
            sh(router.remove_script(rp, gone.url, listed(rp)[gone.url]["id"]))
            time.sleep(2)  # requests the router had sent before it let the replica go
            served_when_out = gone.served()
            time.sleep(2)
            assert gone.served() == served_when_out, "the router still sends to a replica it took out"
            gone.stop()
            time.sleep(3)
        assert clients.ok >= 100, clients.ok
        assert clients.failed == [], f"{len(clients.failed)} of {clients.ok + len(clients.failed)} failed: " \
                                     f"{clients.failed[:5]}"
        assert router_proc.poll() is None, "the router restarted or died"
        assert all(r.proc.poll() is None for r in replicas[1:])
        assert set(listed(rp)) == {r.url for r in replicas[1:]}
        print(f"\n{spec.package} {spec.version}: {clients.ok} chat requests through the front door, "
              f"{len(clients.failed)} failed, while adding {fourth.url} and removing {gone.url}; per replica: "
              f"{[r.served() for r in replicas]}")

        # Every inference route of the front door refuses a request without the key (or with a wrong one).
        body = {"model": SERVED, "prompt": "Say hi.", "text": "Say hi.", "input": "hi", "query": "q",
                "documents": ["d"], "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        refused = {route: [http("POST", f"{front}{route}", body)[0], http("POST", f"{front}{route}", body,
                                                                         "not-the-key")[0]]
                   for route in spec.inference_routes}
        assert all(set(codes) <= {401, 403} for codes in refused.values()), refused
        # The verify gate through the front door (readiness, smoke, the tool-call probe, and every inference
        # route asked without the key), as the router stage runs it.
        report = run_gate(front_door_endpoint(rp, KEY), 30, True, None, tmp_path)
        shown = json.dumps({k: v for k, v in report.items() if k in ("readiness", "smoke", "tool_probe")})[:3000]
        if engine == "vllm":
            # vllm-router re-sends an assistant turn's `reasoning_content` as `reasoning`, the name vLLM reads
            # now (github.com/vllm-project/router/pull/115); the lab's vLLM double still wants the old name and
            # refuses the tool result. Everything else passes through the front door.
            assert report["readiness"]["ok"] and report["smoke"]["ok"], shown
            assert report["tool_probe"]["ok"] or report["tool_probe"]["failures"] == [
                "multi-turn after the tool result: Error code: 400 - reasoning_content of the assistant tool-call "
                "turn was dropped (keep the whole message)"], shown
        else:
            assert report["ok"], shown
        exposed = exposure.check(front_door_endpoint(rp, KEY))
        assert exposed["ok"] and len(exposed["routes"]) == len(spec.inference_routes), exposed
        if nginx:  # the router's worker API is not served at the front door, with or without the key
            assert http("POST", f"{front}/add_worker?url=http://127.0.0.1:1", key=KEY)[0] == 403
            assert http("GET", f"{front}/list_workers", key=KEY)[0] == 403
        else:  # SGLang's router wants the key on its worker API
            assert http("POST", f"{front}/workers", {"url": "http://127.0.0.1:1"})[0] == 401

        # A replica that dies (nobody took it out): the router's health check takes it out, and its list says
        # so, which is what `modelfleet status` reads. Client requests meanwhile are counted too.
        crashed = replicas[1]
        with Clients(front) as during_crash:
            time.sleep(1)
            crashed.proc.kill()
            crashed.proc.wait(timeout=10)
            started = time.time()
            wait_for(lambda: listed(rp)[crashed.url]["healthy"] is False, 3 * router.HEALTH_INTERVAL_S * 2 + 10,
                     "the router's health check marks the dead replica unhealthy")
            taken_out_s = time.time() - started
            time.sleep(2)
        print(f"{spec.package}: dead replica marked unhealthy after {taken_out_s:.0f} s; {during_crash.ok} chat "
              f"requests meanwhile, {len(during_crash.failed)} failed {during_crash.failed[:3]}")
        assert during_crash.ok >= 50 and during_crash.failed == []
    finally:
        stop_all(procs)
        for replica in replicas:
            replica.stop()
