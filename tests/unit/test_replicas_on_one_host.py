"""Several replicas of one model on one host (docs/validation.md, "Several replicas on one host"): each service its
own `pool`, port and GPUs; left without `pool` they are refused by one error that names the way, not by what
would follow from their sharing one pool. Two multi-node pools never share a head (one rendezvous port)."""

from modelfleet.plan import render
from modelfleet.plan.inventory import resolve

QWEN = {"model": "qwen3-8b", "engine": "vllm"}


def host(services: list[dict], **extra) -> tuple[str, dict]:
    return ("g1", {"ssh_hostname": "192.0.2.1", "hardware": "h200", "gpu_count": 8, "revision": "a" * 40,
                   "router": "g1", "api_key_env": "MF_KEY", "services": services, **extra})


def test_two_replicas_without_pool_get_one_error_naming_the_way_and_following_it_resolves(monkeypatch):
    monkeypatch.setenv("MF_KEY", "replica-key-0123456789")
    errors = resolve([host([{**QWEN, "port": 8000}, {**QWEN, "port": 8001}])]).errors
    assert [(w, f) for w, f, _ in errors] == [("host g1", "pool")]  # no "members disagree", no "2 hosts (g1, g1)"
    message = errors[0][2]
    assert "leave `pool` unset" in message and "own `pool` (e.g. g1-0, g1-1) and `port`" in message
    assert "gpu_indices" in message and "Several replicas on one host" in message

    result = resolve([host([{**QWEN, "pool": "g1-0", "port": 8000, "gpu_indices": [0]},
                            {**QWEN, "pool": "g1-1", "port": 8001, "gpu_indices": [1]}], gpu_count=2)])
    assert result.errors == []
    a, b = result.hosts["g1"].services
    assert (a.unit_name, b.unit_name) == ("modelfleet-g1-0.service", "modelfleet-g1-1.service")
    assert (a.env_file, b.env_file) == ("/etc/modelfleet/g1-0.env", "/etc/modelfleet/g1-1.env")
    assert a.container_name != b.container_name and (a.port, b.port) == (8000, 8001)
    assert a.model_dir == b.model_dir  # one checkpoint on the host, fetched once
    assert render.gpu_flags(a) == ["--device", "nvidia.com/gpu=0"]
    assert render.gpu_flags(b) == ["--device", "nvidia.com/gpu=1"]
    door = result.routers["qwen3-8b"]
    assert [w.url for w in door.workers] == ["http://127.0.0.1:8000", "http://127.0.0.1:8001"]


def test_a_pool_named_twice_on_one_host_is_one_error():
    errors = resolve([host([{**QWEN, "pool": "q", "port": 8000}, {**QWEN, "pool": "q", "port": 8001}],
                           router=None, api_key_env=None)]).errors
    assert [(w, f) for w, f, _ in errors] == [("host g1", "pool")]
    assert "name pool q: a pool is one service per host" in errors[0][2]


def test_two_multi_node_pools_headed_by_one_host_are_refused():
    dp2 = {"model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm-dp2"}
    members = [(name, {"hardware": "lab-cpu", "ssh_hostname": address, "services": [
        {**dp2, "pool": "k1", "port": 8000}, {**dp2, "pool": "k2", "port": 8001}]})
        for name, address in (("t1", "10.0.0.1"), ("t2", "10.0.0.2"))]
    errors = resolve(members).errors
    assert [(w, f) for w, f, _ in errors] == [("pool k2", "hosts")]
    assert "its head t1 (its first host) also heads the multi-node pool k1" in errors[0][2]
    def one(name, address, pool, port):
        return (name, {"hardware": "lab-cpu", "ssh_hostname": address, "services": [{**dp2, "pool": pool,
                                                                                   "port": port}]})
    apart = [one("t1", "10.0.0.1", "k1", 8000), one("t2", "10.0.0.2", "k1", 8000),
             one("t3", "10.0.0.3", "k2", 8001), one("t4", "10.0.0.4", "k2", 8001)]
    assert resolve(apart).errors == []


def test_replicas_keeping_experts_in_host_ram_must_fit_it_together():
    llama = {"model": "kimi-k3", "engine": "llama.cpp", "recipe": "kimi-k3-llamacpp-iq1-m-2gpu-ram"}

    def replicas(n: int, ram_gib: int):
        return resolve([("g1", {"ssh_hostname": "192.0.2.1", "hardware": "h200", "revision": "a" * 40,
                                "host_ram_gib": ram_gib, "services": [
                                    {**llama, "pool": f"k{i}", "port": 8080 + 10 * i} for i in range(n)]})]).errors
    assert replicas(1, 800) == [] and replicas(2, 1024) == []  # about 479 GB each
    errors = replicas(2, 800)
    assert [(w, f) for w, f, _ in errors] == [("host g1", "services")]
    assert errors[0][2].startswith("its services keep 959 GB of experts in host RAM together (pool k0 479 GB, "
                                   "pool k1 479 GB), the host has 800 GiB")
