"""No collision passes validate (issue 50, item 3): on one host, one owner per unit, per file and per front-door
port; a host in two groups whose data disagree; one fabric_address per member of a pool. Each refused naming
the host (or file) and the field, with the other errors at once."""

import pytest

from modelfleet.plan.inventory import resolve
from tests.helpers.recipe_pools import pool

KEY_ENV = "MF_CLAIMS_KEY"


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "claims-key-0123456789")


def replica(address: str, fabric: str, **extra) -> dict:
    return {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "sglang", "recipe": "tiny-lab-sglang",
            "ssh_hostname": address, "fabric_address": fabric, "router": "gw", "api_key_env": KEY_ENV, **extra}


def gateway(**extra):
    return ("gw", {"router_only": True, "ssh_hostname": "10.0.0.9", **extra})


def collisions(result, host: str) -> list[tuple[str, str]]:
    return [(f, m) for w, f, m in result.errors if w == f"host {host}" and "one overwriting the other" in m]


def test_two_front_doors_on_one_router_host_cannot_take_one_port():
    """Two models behind one router host, both on the default router_port: before, validate passed and the
    second front door's router took the first's port (or failed to start)."""
    hosts = [gateway(), ("a", replica("10.0.0.2", "10.1.0.2")),
             ("b", replica("10.0.0.3", "10.1.0.3", served_name="tiny-b"))]
    found = collisions(resolve(hosts), "gw")
    assert {f for f, _ in found} == {"router_port"} and len(found) == 3, found  # door, router behind, metrics
    assert "port 8800 would be taken by both the front door of tiny-lab" in found[0][1] and "tiny-b" in found[0][1]
    # Overlapping by one (8800-8802 and 8802-8804): the metrics port of one is the door of the other.
    hosts[2] = ("b", replica("10.0.0.3", "10.1.0.3", served_name="tiny-b", router_port=8802))
    assert [f for f, _ in collisions(resolve(hosts), "gw")] == ["router_port"]
    hosts[2] = ("b", replica("10.0.0.3", "10.1.0.3", served_name="tiny-b", router_port=8810))
    assert resolve(hosts).errors == []


@pytest.mark.parametrize("pool_name,what", [
    ("router-tiny-lab", "unit modelfleet-router-tiny-lab.service"),
    ("door-tiny-lab", "unit modelfleet-door-tiny-lab.service"),
])
def test_a_pool_named_like_a_front_doors_unit_is_refused(pool_name, what):
    """A pool on the router host named `router-<model>` renders to the same unit as that model's front door,
    one overwriting the other."""
    hosts = [("gw", replica("10.0.0.9", "10.1.0.9", router=None, api_key_env=None,
                            services=[{"pool": pool_name, "port": 30001}])),
             ("a", replica("10.0.0.2", "10.1.0.2")), ("b", replica("10.0.0.3", "10.1.0.3"))]
    found = collisions(resolve(hosts), "gw")
    assert found and found[0][0] == "pool" and what in found[0][1], resolve(hosts).errors
    assert f"pool {pool_name}" in found[0][1] and "the front door of tiny-lab" in found[0][1]


def test_a_prefill_servers_bootstrap_port_is_a_port_of_its_host():
    """SGLang's prefill server also listens on its bootstrap port (8998 by default): an engine port on it is
    refused like any other collision."""
    from modelfleet.plan.catalog.routers import bootstrap_port
    from tests.helpers.recipe_pools import CATALOG

    taken = bootstrap_port(CATALOG.recipes["kimi-k3-sglang-pd-prefill-b300"], "sglang")
    result = pool("kimi-k3-sglang-pd-prefill-b300", "b300", port=taken)
    found = collisions(result, "n0")
    assert [f for f, _ in found] == ["port"] and "prefill bootstrap server" in found[0][1], result.errors
    assert collisions(pool("kimi-k3-sglang-pd-prefill-b300", "b300", port=taken + 1), "n0") == []


def test_a_host_in_two_groups_whose_data_disagree_is_refused_naming_both(tmp_path):
    from modelfleet.plan.inventory.door import open_inventory

    base = {"hardware": "h200", "gpu_count": 1, "engine": "vllm", "ssh_hostname": "10.0.0.1"}
    inv = tmp_path / "inv.py"
    inv.write_text(f"east = (['h1'], {{'model': 'qwen3-8b', 'router_port': 8800}})\n"
                   f"canary = (['h1'], {{'model': 'tiny-lab', 'router_port': 8800}})\n"
                   f"all_hosts = [('h1', {base!r})]\n")
    result = open_inventory(str(inv))
    found = [(w, f, m) for w, f, m in result.errors if "give it different values" in m]
    assert [(w, f) for w, f, _ in found] == [("host h1", "model")], result.errors  # router_port agrees
    assert "groups east and canary" in found[0][2]
    # The same through group_data files; and settled by the host's own value.
    inv.write_text(f"east = ['h1']\ncanary = ['h1']\nall_hosts = [('h1', {base!r})]\n")
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "east.py").write_text("port = 8001\n")
    (tmp_path / "group_data" / "canary.py").write_text("port = 8002\n")
    result = open_inventory(str(inv), cwd=str(tmp_path))
    assert [(w, f) for w, f, m in result.errors if "give it different values" in m] == [("host h1", "port")]
    inv.write_text(f"east = ['h1']\ncanary = ['h1']\nall_hosts = [('h1', {{**{base!r}, 'port': 8003}})]\n")
    assert [m for _, _, m in open_inventory(str(inv), cwd=str(tmp_path)).errors
            if "give it different values" in m] == []
    # --data settles it too.
    inv.write_text(f"east = ['h1']\ncanary = ['h1']\nall_hosts = [('h1', {base!r})]\n")
    assert [m for _, _, m in open_inventory(str(inv), cwd=str(tmp_path), data={"port": 8004}).errors
            if "give it different values" in m] == []


def test_one_fabric_address_per_member_of_a_pool():
    """Two trays of a GB300 pool given one fabric_address: rendezvous and peers would reach one host twice."""
    result = pool("kimi-k3-vllm-gb300", "gb300", fabric_address="10.9.0.1")
    found = [(w, f) for w, f, _ in result.errors if f == "fabric_address"]
    assert found and all(w.startswith("host n") for w, _ in found), result.errors
    assert all("same pool" in m for _, f, m in result.errors if f == "fabric_address")
