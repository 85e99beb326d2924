"""The fleet's Prometheus scrape configuration (prometheus.py) from resolved inventories: one engine target per
pool at its head where its metrics listen as the host gets them, each front door's router metrics, exporters per
host where asked, and what a remote Prometheus cannot reach named instead of listed."""

import pytest

from modelfleet.plan import router
from modelfleet.plan.inventory import resolve
from modelfleet.plan.prometheus import notes, scrape_config
from tests.helpers.front_doors import KEY, host

PIN = "e" * 40
TRAYS = {"hardware": "gb300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": PIN, "pool": "k31"}


def fleet():
    resolved = resolve([
        ("t1", {**TRAYS, "ssh_hostname": "10.0.0.1"}), ("t2", {**TRAYS, "ssh_hostname": "10.0.0.2"}),
        ("lab", {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm",
                "ssh_hostname": "10.0.0.3"})])
    assert not resolved.errors, resolved.errors
    return resolved


def jobs(config: dict) -> dict[str, list[dict]]:
    return {job["job_name"]: job["static_configs"] for job in config["scrape_configs"]}


def test_engines_are_scraped_at_the_head_only_with_their_labels():
    config = scrape_config(fleet(), interval_s=30, on="t1")
    assert config["global"] == {"scrape_interval": "30s"}
    engines = jobs(config)["modelfleet-engines"]
    assert [e["labels"]["host"] for e in engines] == ["t1"]
    assert [e["labels"]["host"] for e in jobs(scrape_config(fleet(), on="t2")).get("modelfleet-engines", [])] == []
    head = engines[0]  # t2 is a headless member of k31
    assert head["targets"] == ["127.0.0.1:8000"]
    assert head["labels"] == {"pool": "k31", "host": "t1", "model": "kimi-k3.1-pro", "served_name": "kimi-k3.1-pro",
                                   "engine": "vllm", "node_rank": "0"}
    assert set(jobs(config)) == {"modelfleet-engines"}  # no exporter unless asked


def test_dcgm_only_on_nvidia_hosts_and_node_exporter_on_every_host():
    found = jobs(scrape_config(fleet(), dcgm=True, node_exporter=True))
    assert [t["labels"]["host"] for t in found["modelfleet-dcgm"]] == ["t1", "t2"]  # the lab's CPU host has none
    assert found["modelfleet-dcgm"][0]["targets"][0].endswith(":9400")
    assert found["modelfleet-dcgm"][0]["labels"] == {"host": "t1", "pool": "k31", "hardware": "gb300"}
    assert [t["targets"][0].rsplit(":", 1)[1] for t in found["modelfleet-node"]] == ["9100"] * 3


def test_a_host_whose_data_runs_the_dcgm_exporter_is_scraped_without_the_flag():
    resolved = resolve([("t1", {**TRAYS, "ssh_hostname": "10.0.0.1", "fabric_address": "10.9.0.1",
                                "dcgm_exporter": True}), ("t2", {**TRAYS, "ssh_hostname": "10.0.0.2"})])
    assert not resolved.errors, resolved.errors
    assert jobs(scrape_config(resolved))["modelfleet-dcgm"] == [
        {"targets": ["10.9.0.1:9400"], "labels": {"host": "t1", "pool": "k31", "hardware": "gb300"}}]


def test_loopback_engines_are_named_for_the_operator_not_listed_as_targets():
    config = scrape_config(fleet())
    assert "modelfleet-engines" not in jobs(config)  # every engine here listens on its host's loopback
    said = notes(fleet())
    assert [line.split(":")[0] for line in said] == ["t1", "lab"]
    assert "127.0.0.1:8000 (loopback only)" in said[0] and "--on t1" in said[0]


def test_a_host_reached_at_its_own_loopback_address_is_scraped_there():
    """The lab's hosts (and a host on this machine) are reached at a 127/8 address their engines bind: scraped."""
    lab = {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm",
           "ssh_hostname": "127.0.1.11", "bind_address": "127.0.1.11"}
    resolved = resolve([("mflab-1", lab)])
    assert not resolved.errors, resolved.errors
    assert [e["targets"] for e in jobs(scrape_config(resolved))["modelfleet-engines"]] == [["127.0.1.11:8000"]]
    assert notes(resolved) == []


def test_a_wildcard_bind_is_scraped_at_the_hosts_address_and_sglangs_open_metrics_need_no_key(monkeypatch):
    monkeypatch.setenv("MF_KEY", KEY)
    resolved = resolve([("g1", {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "sglang",
                                "recipe": "tiny-lab-sglang", "ssh_hostname": "10.0.0.7", "bind_address": "0.0.0.0",
                                "api_key_env": "MF_KEY"})])
    assert not resolved.errors, resolved.errors
    found = jobs(scrape_config(resolved))
    assert [t["targets"] for t in found["modelfleet-engines"]] == [["10.0.0.7:30000"]]  # not 0.0.0.0
    assert notes(resolved) == []


def test_a_keyed_metrics_gets_a_job_reading_the_key_from_a_file_never_the_key(monkeypatch):
    monkeypatch.setenv("MF_KEY", KEY)
    resolved = resolve([("g1", {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "llama.cpp",
                                "recipe": "tiny-lab-llamacpp", "ssh_hostname": "10.0.0.7", "bind_address": "10.0.0.7",
                                "api_key_env": "MF_KEY"})])
    assert not resolved.errors, resolved.errors
    config = scrape_config(resolved, key_dir="/srv/keys")
    job = {j["job_name"]: j for j in config["scrape_configs"]}["modelfleet-engines-mf-key"]
    assert job["authorization"] == {"type": "Bearer", "credentials_file": "/srv/keys/MF_KEY"}
    assert job["static_configs"][0]["targets"] == ["10.0.0.7:8080"]
    assert KEY not in str(config)
    assert notes(resolved, key_dir="/srv/keys") == [
        "keyed /metrics: put the key of MF_KEY in /srv/keys/MF_KEY on the Prometheus host, readable by Prometheus "
        "only (--key-dir changes the directory)"]


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_replicas_at_their_fabric_address_and_each_front_door_at_its_routers_metrics_port(monkeypatch, engine):
    monkeypatch.setenv("MF_ROUTER_KEY", KEY)
    resolved = resolve([("r1", host("10.0.0.1", "10.1.0.1", engine)), ("a", host("10.0.0.2", "10.1.0.2", engine)),
                        ("b", host("10.0.0.3", "10.1.0.3", engine))])
    assert not resolved.errors, resolved.errors
    rp = resolved.routers["tiny-lab"]
    port = resolved.hosts["a"].services[0].port
    found = jobs(scrape_config(resolved))
    # vLLM's replicas off r1 sit behind a keyed proxy of their host, which keys /metrics too; SGLang leaves it open
    replicas = found["modelfleet-engines-mf-router-key" if engine == "vllm" else "modelfleet-engines"]
    assert [t["targets"] for t in replicas] == [[f"10.1.0.2:{port}"], [f"10.1.0.3:{port}"]]
    assert "modelfleet-front-doors" not in found  # the router's metrics listen on r1's loopback only
    argv = router.router_args(rp)
    listen = f"{argv[argv.index('--prometheus-host') + 1]}:{argv[argv.index('--prometheus-port') + 1]}"
    assert listen == f"127.0.0.1:{rp.port + 2}"
    said = notes(resolved)
    assert f"r1: front door tiny-lab: not scraped: its metrics listen on {listen} (loopback only)" in "".join(said)
    on_r1 = jobs(scrape_config(resolved, on="r1"))
    assert on_r1["modelfleet-front-doors"] == [{"targets": [listen], "labels": {
        "front_door": "tiny-lab", "host": "r1", "served_name": "tiny-lab", "router": engine}}]
    assert [t["labels"]["host"] for t in on_r1["modelfleet-engines"]] == ["r1"]  # the replica beside its router


def test_an_engine_without_metrics_is_named_not_listed():
    resolved = resolve([("o1", {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "ollama",
                                "recipe": "tiny-lab-ollama", "ssh_hostname": "10.0.0.8"})])
    assert not resolved.errors, resolved.errors
    assert "modelfleet-engines" not in jobs(scrape_config(resolved, on="o1"))
    assert notes(resolved) == ["o1: pool o1: not scraped: the catalogue knows no /metrics of ollama on its API "
                               "(catalog/engines.yaml)"]
