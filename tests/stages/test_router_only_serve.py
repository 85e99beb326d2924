"""A router-only host through serve.py's every stage (pyinfra's @fake connector): the front door is installed
(its venv, launcher, config, key and unit) and nothing of an engine host is: no driver, toolkit or Docker from
the GPU stack, no admission, no checkpoint, no engine image, no engine unit."""

import pytest
from pyinfra import host

from modelfleet.plan import router
from modelfleet.plan.inventory import resolve
from modelfleet.run import pipeline
from modelfleet.run.stages import router as router_stage

KEY = "router-only-serve-key-01"


def replica(fabric: str, port: int) -> dict:
    return {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "sglang", "recipe": "tiny-lab-sglang",
            "port": port, "router": "@fake/gw", "router_bind_address": "127.0.0.1", "api_key_env": "MF_RO_SERVE_KEY",
            "fabric_address": fabric, "image": "lmsysorg/sglang:v0.5.23@sha256:" + "e" * 64, "revision": "a" * 40}


GATEWAY = {"router_only": True, "fabric_address": "127.0.0.1"}


@pytest.fixture(autouse=True)
def env(monkeypatch, tmp_path):
    monkeypatch.setenv("MF_RO_SERVE_KEY", KEY)
    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    monkeypatch.setattr(router_stage, "endpoint_verified", lambda **kwargs: None)


def test_serve_on_a_router_only_host_installs_the_front_door_and_no_engine(fake, uploads):
    hosts = [("gw", GATEWAY), ("a", replica("127.0.0.2", 18012))]
    result = resolve([(f"@fake/{n}", d) for n, d in hosts])
    assert result.errors == []
    rp = result.routers["tiny-lab"]
    # Only the router host converges here (the replica's own stages are other tests').
    state = fake.run_fake(hosts, lambda: pipeline.run_stages(*pipeline.SERVE) if host.name == "@fake/gw" else None)
    # What changes the host (the fact reads, which ask nvidia-smi and docker what is there, left out).
    sent = "\n".join(c for c in fake.executed(state, "gw") if "@@modelfleet-" not in c)
    # (the read that asks whether an install was interrupted names apt-get too)
    apt = [c for c in fake.executed(state, "gw") if "apt-get" in c and " install " in c and "dpkg --audit" not in c]
    assert apt and all(c.rstrip("'").endswith(" install python3-venv curl") for c in apt), apt  # the router's base only
    for engine_thing in ("nvidia", "docker", "rocm", "amdgpu", "huggingface", "modelfleet_fetch", "tiny-lab.env"):
        assert engine_thing not in sent.lower(), engine_thing
    assert router.venv(rp) in sent
    wrote = set(uploads.files)
    p = router.paths(rp)
    assert {p["unit"], p["config"], p["workers"], p["key"], router.LAUNCHER} <= wrote, sorted(wrote)
    assert uploads.files[p["key"]] == KEY + "\n"
    assert not any(path.startswith(result.hosts["@fake/gw"].model_root) for path in wrote)
    assert [path for path in wrote if path.endswith(".service")] == [p["unit"]]
