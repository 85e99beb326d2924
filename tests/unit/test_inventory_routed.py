"""The front doors an inventory asks for (modelfleet.plan.inventory.routed), through the resolver: one per router host
and served name, its replicas bound where only the router reaches them, problems naming host or front door and
field, keys never echoed."""

import pytest

from modelfleet.plan import router
from modelfleet.plan.inventory import resolve
from tests.helpers.front_doors import KEY, fleet, host


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("MF_ROUTER_KEY", KEY)


def test_replicas_sit_behind_one_front_door_and_listen_only_for_it():
    result = resolve(fleet())
    assert result.errors == []
    rp = result.routers["tiny-lab"]
    assert (rp.host, rp.engine_name, rp.bind_address, rp.port, rp.policy) == ("r1", "sglang", "10.0.0.1", 8800,
                                                                               "cache_aware")
    # The replica beside the router listens on loopback, the others on their fabric address.
    assert [w.url for w in rp.workers] == ["http://10.1.0.2:30000", "http://10.1.0.3:30000", "http://127.0.0.1:30000"]
    assert {n: h.services[0].bind_address for n, h in result.hosts.items()} == {
        "r1": "127.0.0.1", "a": "10.1.0.2", "b": "10.1.0.3"}
    assert result.hosts["r1"].routers == (rp,) and result.hosts["a"].routers == ()


def test_a_front_door_is_refused_naming_host_and_field(monkeypatch):
    monkeypatch.delenv("MF_ROUTER_KEY")
    entries = [("r1", {"hardware": "lab-cpu", "ssh_hostname": "r1.example.org"}),
               ("a", host("10.0.0.2", "10.1.0.2", api_key_env=None)),  # no key: the door would be open
               ("b", host("10.0.0.3", "10.1.0.3", bind_address="10.1.0.3")),  # the router decides where it binds
               ("c", host("10.0.0.4", "10.1.0.4", engine="llama.cpp", recipe="tiny-lab-llamacpp", router="r1",
                          served_name="other")),  # llama.cpp has no router
               ("d", host("10.0.0.5", "10.1.0.5", router="nowhere", served_name="third"))]
    problems = {(where, fld) for where, fld, _ in resolve(entries, offline=True).errors}
    assert {("host a", "api_key_env"), ("host b", "bind_address"), ("host c", "router"),
            ("host d", "router"), ("router tiny-lab", "router_bind_address")} <= problems


def test_replicas_must_agree_and_the_ports_be_free():
    entries = fleet(router_port=30000)  # the replica on r1 listens there
    entries[1] = ("a", host("10.0.0.2", "10.1.0.2", router_port=8900))
    problems = {(where, fld) for where, fld, _ in resolve(entries).errors}
    assert ("router tiny-lab", "router_port") in problems
    messages = [m for _, fld, m in resolve(fleet(router_port=29999)).errors if fld == "router_port"]
    assert messages == ["29999: port 30000 (the router behind it) is used by pool r1 on r1"]


def test_a_key_the_proxy_cannot_hold_is_refused_before_any_host(monkeypatch):
    monkeypatch.setenv("MF_ROUTER_KEY", 'has"quote and space')
    errors = resolve(fleet("vllm")).errors
    assert [(w, f) for w, f, _ in errors] == [("router tiny-lab", "api_key_env")]
    assert 'quote' not in errors[0][2]  # the value is never echoed
    with pytest.raises(ValueError):
        router.proxy_key_conf('has"quote and space')


def test_a_routed_vllm_replica_off_its_router_host_listens_behind_a_keyed_proxy_of_its_own():
    # vLLM's key leaves /invocations open: the engine listens on loopback, a keyed proxy on the fabric for it.
    entries = [("r1", host("10.0.0.1", "10.1.0.1", "vllm")), ("a", host("10.0.0.2", "10.1.0.2", "vllm"))]
    result = resolve(entries)
    assert result.errors == []
    replica = result.hosts["a"].services[0]
    assert (replica.bind_address, replica.door_address, replica.router_url) == (
        "127.0.0.1", "10.1.0.2", f"http://10.1.0.2:{replica.port}")
    assert [w.url for w in result.routers["tiny-lab"].workers] == [f"http://10.1.0.2:{replica.port}",
                                                                   f"http://127.0.0.1:{replica.port}"]
    beside = result.hosts["r1"].services[0]
    assert (beside.bind_address, beside.door_address) == ("127.0.0.1", None)  # beside its router: loopback only
    # SGLang's key covers every route that runs the model: its replicas listen on the fabric themselves.
    assert {s.door_address for h in resolve(fleet("sglang")).hosts.values() for s in h.services} == {None}
