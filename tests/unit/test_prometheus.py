"""The fleet's Prometheus scrape configuration (prometheus.py) from resolved inventories: one engine target per
pool at its head, exporters per host where asked, and the loopback-bound engines a remote Prometheus cannot reach."""

from modelfleet.inventory import resolve
from modelfleet.prometheus import loopback_targets, scrape_config

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
    config = scrape_config(fleet(), interval_s=30)
    assert config["global"] == {"scrape_interval": "30s"}
    engines = jobs(config)["modelfleet-engines"]
    assert [e["labels"]["host"] for e in engines] == ["t1", "lab"]  # t2 is a headless member of k31
    head = engines[0]
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


def test_loopback_engines_are_named_for_the_operator():
    assert loopback_targets(fleet()) == ["lab/lab", "t1/k31"]
