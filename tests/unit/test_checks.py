"""The endpoints the client-side checks talk to (checks/__init__.py), from resolved inventories: one per service,
the head node only for a multi-node pool, the key the host's engine was given, and whether this machine reaches
a loopback-bound engine directly or through a tunnel."""

from modelfleet.plan.inventory import resolve
from modelfleet.run.checks import endpoint, inventory_endpoints, reachable_from_control_node
from tests.helpers.made_keys import made_key

PIN = "e" * 40
KIMI = {"hardware": "b300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": PIN}


def test_a_host_gives_its_served_name_url_and_engine():
    plan = resolve([("b300-01", {**KIMI, "pool": "k31", "served_name": "kimi-local"})]).hosts["b300-01"]
    point = endpoint(plan, plan.services[0])
    assert (point.name, point.model, point.engine, point.pool) == ("b300-01/k31", "kimi-local", "vllm", "k31")
    assert point.base_url == "http://127.0.0.1:8000" and point.openai_base_url == "http://127.0.0.1:8000/v1"
    assert point.api_key is None


def test_a_keyed_service_gives_the_key_its_engine_was_started_with(monkeypatch):
    key = made_key()
    monkeypatch.setenv("SITE_KIMI_KEY", key)
    plan = resolve([("b300-01", {**KIMI, "api_key_env": "SITE_KIMI_KEY"})]).hosts["b300-01"]
    assert endpoint(plan, plan.services[0]).api_key == key


def test_a_multi_node_pool_is_one_endpoint_at_its_head_and_hosts_narrow_the_list():
    trays = {"hardware": "gb300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": PIN, "pool": "k31"}
    resolved = resolve([("t1", {**trays, "ssh_hostname": "10.0.0.1"}), ("t2", {**trays, "ssh_hostname": "10.0.0.2"}),
                        ("b300-01", {**KIMI, "pool": "solo"})])
    assert not resolved.errors, resolved.errors
    assert [p.name for p in inventory_endpoints(resolved)] == ["t1/k31", "b300-01/solo"]
    assert [p.name for p in inventory_endpoints(resolved, hosts=("b300-01",))] == ["b300-01/solo"]
    assert inventory_endpoints(resolved, hosts=("t2",)) == []  # a member serves nothing of its own


def test_a_loopback_engine_is_reached_directly_only_on_a_shared_loopback(monkeypatch):
    monkeypatch.setenv("SITE_KIMI_KEY", made_key())
    remote = resolve([("gpu-01", {**KIMI, "ssh_hostname": "10.0.0.9"})]).hosts["gpu-01"]
    assert remote.services[0].loopback and not reachable_from_control_node(remote, remote.services[0])
    local = resolve([("@local", KIMI)]).hosts["@local"]
    assert reachable_from_control_node(local, local.services[0])
    opened = resolve([("gpu-01", {**KIMI, "ssh_hostname": "10.0.0.9", "bind_address": "0.0.0.0",
                                  "api_key_env": "SITE_KIMI_KEY"})]).hosts["gpu-01"]
    assert reachable_from_control_node(opened, opened.services[0])
