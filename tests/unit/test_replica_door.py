"""The keyed proxy before a routed replica on its own host (modelfleet.plan.replica_door): which replicas get one, and
the files it is started from (nginx's config, its 0600 key map, its unit). The real nginx in front of a vLLM engine
double, behind the real router, is attacked in tests/router/test_door_attacks_e2e.py."""

import pytest

from modelfleet.plan import replica_door
from modelfleet.plan.inventory import resolve

KEY = "replica-door-key-0123"


def host(address: str, fabric: str, engine: str = "vllm") -> dict:
    return {"hardware": "lab-cpu", "model": "tiny-lab", "engine": engine, "recipe": f"tiny-lab-{engine}",
            "ssh_hostname": address, "fabric_address": fabric, "router": "r1", "api_key_env": "MF_DOOR_KEY"}


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("MF_DOOR_KEY", KEY)


def test_only_a_replica_off_its_router_host_whose_key_leaves_a_route_open_gets_a_door():
    result = resolve([("r1", host("10.0.0.1", "10.1.0.1")), ("a", host("10.0.0.2", "10.1.0.2"))])
    assert result.errors == []
    assert replica_door.doors(result.hosts["r1"]) == []  # beside its router: on loopback
    (svc,) = replica_door.doors(result.hosts["a"])
    assert (svc.bind_address, svc.door_address) == ("127.0.0.1", "10.1.0.2")
    sglang = resolve([("r1", host("10.0.0.1", "10.1.0.1", "sglang")), ("a", host("10.0.0.2", "10.1.0.2", "sglang"))])
    assert replica_door.doors(sglang.hosts["a"]) == []


def test_the_door_listens_on_the_fabric_keys_every_route_and_passes_to_the_engine_on_loopback():
    svc = resolve([("r1", host("10.0.0.1", "10.1.0.1")), ("a", host("10.0.0.2", "10.1.0.2"))]).hosts["a"].services[0]
    files = {path: (content, mode, secret) for path, content, mode, secret in replica_door.files(svc, KEY)}
    p = replica_door.paths(svc)
    conf, unit = files[p["conf"]][0], files[p["unit"]][0]
    assert f"listen 10.1.0.2:{svc.port};" in conf and f"server 127.0.0.1:{svc.port};" in conf
    assert f"include {p['key']};" in conf and "return 401;" in conf and KEY not in conf + unit
    assert files[p["key"]][1:] == ("0600", True) and KEY in files[p["key"]][0]
    assert f"After=network-online.target {svc.unit_name}" in unit and f"-c {p['conf']}" in unit
    assert p["conf"].startswith(svc.config_dir + "/door-replica-")


def test_render_shows_a_routed_replicas_keyed_proxy_as_the_run_writes_it(tmp_path):
    """The preview is the promise: a routed vLLM replica off its router host listens behind a keyed proxy on
    the fabric, and `render` shows that proxy's files (the key masked) beside the engine's unit."""
    from click.testing import CliRunner

    from modelfleet.cli import main

    inv = tmp_path / "inv.py"
    inv.write_text(f"hosts = {[('r1', host('10.0.0.1', '10.1.0.1')), ('a', host('10.0.0.2', '10.1.0.2'))]!r}\n")
    out = CliRunner().invoke(main, ["render", str(inv), "a", "--json"])
    assert out.exit_code == 0, out.output
    (svc,) = replica_door.doors(resolve([("r1", host("10.0.0.1", "10.1.0.1")),
                                         ("a", host("10.0.0.2", "10.1.0.2"))]).hosts["a"])
    p = replica_door.paths(svc)
    assert all(path in out.stdout for path in (p["conf"], p["key"], p["unit"])), out.stdout[:2000]
    assert "listen 10.1.0.2:" in out.stdout and KEY not in out.stdout
