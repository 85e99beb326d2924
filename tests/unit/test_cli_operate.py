"""modelfleet.cli.operate through click's runner: prometheus to a file, converge's shards."""

from __future__ import annotations

import json

import yaml

from tests.helpers.cli_runner import H200, PIN, inventory, run


def test_prometheus_writes_the_same_configuration_to_a_file_and_notes_loopback_engines(tmp_path):
    inv = inventory(tmp_path, {"g1": H200})
    printed = run("prometheus", inv)
    written = tmp_path / "prometheus.yml"
    to_file = run("prometheus", inv, "-o", written)
    assert printed.exit_code == to_file.exit_code == 0
    assert yaml.safe_load(written.read_text()) == yaml.safe_load(printed.stdout)
    assert to_file.stdout == "" and "(loopback only)" in to_file.stderr and "--on g1" in to_file.stderr
    on_host = run("prometheus", inv, "--on", "g1")
    assert on_host.exit_code == 0 and "(loopback only)" not in on_host.stderr
    assert [j["job_name"] for j in yaml.safe_load(on_host.stdout)["scrape_configs"]] == ["modelfleet-engines"]
    assert run("prometheus", inv, "--on", "nope").exit_code == 2


def test_converge_dry_keeps_a_pool_in_one_shard(tmp_path):
    trays = {"hardware": "gb300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": PIN, "pool": "k31"}
    inv = inventory(tmp_path, {"t1": {**trays, "ssh_hostname": "10.0.0.1"}, "t2": {**trays, "ssh_hostname": "10.0.0.2"},
                               "g1": {**H200, "ssh_hostname": "10.0.0.3"}, "g2": {**H200, "ssh_hostname": "10.0.0.4"}})
    out = run("converge", "--dry", "--shards", "3", inv)
    assert out.exit_code == 0, out.output
    shards = [sorted(s["hosts"]) for s in json.loads(out.output)["shards"]]
    assert sorted(h for s in shards for h in s) == ["g1", "g2", "t1", "t2"]
    assert ["t1", "t2"] in shards  # the pool together
    # One slice per control node: the same split, slice K of it; a bad slice is a usage error before anything.
    slices = [json.loads(run("converge", "--dry", "--shard", f"{k}/3", inv).output)["shards"] for k in (1, 2, 3)]
    assert [s["hosts"] for part in slices for s in part] == [s["hosts"] for s in json.loads(out.output)["shards"]]
    assert [s["shard"] for part in slices for s in part] == [1, 2, 3]
    bad = run("converge", "--dry", "--shard", "4/3", inv)
    assert bad.exit_code == 2 and "expected K/N" in bad.output
    both = run("converge", "--dry", "--shard", "1/3", "--shards", "2", inv)
    assert both.exit_code == 2 and "leave out --shards" in both.output
