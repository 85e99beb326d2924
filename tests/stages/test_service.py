"""Stage service through pyinfra's @fake connector: the guides' command for Kimi on 8x B300, nothing sent to a
converged host, and a replica's unit under its pool's name retired."""

import hashlib  # noqa: F401

import pytest

from modelfleet.inventory import resolve
from tests.fake.hosts import IMAGE, b300_host, b300_probe, changed_ops, converged_replies, serve


@pytest.fixture(autouse=True)
def reports(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    return tmp_path / "preflight"


def test_b300_kimi_serve_sends_the_guides_command(fake, uploads, monkeypatch):
    host = {**b300_host(), "fake_responses": {"@@modelfleet-probe": b300_probe(fake)}}
    state = fake.run_fake([("b300-01", host)], serve)
    commands = fake.executed(state, "b300-01")
    assert f"docker pull --quiet {IMAGE}" in commands
    assert "systemctl daemon-reload" in commands
    assert "systemctl start modelfleet-k31.service" in commands
    assert "systemctl enable modelfleet-k31.service" in commands
    unit = uploads.files["/etc/systemd/system/modelfleet-k31.service"]
    for flag in ("--tensor-parallel-size 8", "--trust-remote-code", "--load-format fastsafetensors",
                 "--enable-auto-tool-choice", "--tool-call-parser kimi_k3", "--reasoning-parser kimi_k3",
                 "--max-model-len 32768", "--host 127.0.0.1", "--port 8000", "--served-model-name kimi-local"):
        assert flag in unit
    assert IMAGE in unit
    assert uploads.files["/etc/modelfleet/k31.env"].endswith("VLLM_ENGINE_READY_TIMEOUT_S=3600\n")
    assert any("curl -fsS -m 5 http://127.0.0.1:8000/health" in c for c in commands)


def test_converged_b300_host_gets_no_commands(fake):
    svc = resolve([("@fake/b300-01", b300_host())]).hosts["@fake/b300-01"].services[0]
    host = {**b300_host(), "fake_responses": converged_replies(fake, svc)}
    state = fake.run_fake([("b300-01", host)], serve)
    assert changed_ops(state, "b300-01") == []
    # Two round trips: the preflight probe, and what the stages find deployed (files, units, images).
    assert len(fake.executed(state, "b300-01")) == 2, fake.executed(state, "b300-01")


def test_replicas_share_one_unit_name_and_a_replicas_unit_under_its_pool_name_is_retired(fake, uploads, monkeypatch):
    """Replicas (no `pool`) are pools of their own named after their host, but their units are named after
    what they serve; a unit of the replica under its pool's (host's) name is stopped and removed before the new
    one starts."""
    replica = {k: v for k, v in b300_host().items() if k != "pool"}
    plans = resolve([("@fake/r1", replica), ("@fake/r2", replica)]).hosts
    assert {p.services[0].unit_name for p in plans.values()} == {"modelfleet-kimi-local.service"}
    assert len({p.services[0].pool for p in plans.values()}) == 2  # each replica its own pool
    first = plans["@fake/r1"].services[0]
    old = first.legacy_unit_name
    assert old == f"modelfleet-{first.pool}.service"
    replies = {"@@modelfleet-probe": b300_probe(fake),
               "@@modelfleet-state": [f"@@modelfleet-state path /etc/systemd/system/{old}", "file 644 root root " + "0" * 64,
                                      f"@@modelfleet-state unit {old}", "ActiveState=active", "UnitFileState=enabled"]}
    state = fake.run_fake([("r1", {**replica, "fake_responses": replies})], serve)
    commands = fake.executed(state, "r1")
    assert "/etc/systemd/system/modelfleet-kimi-local.service" in uploads.files
    retired = commands.index(f"systemctl disable --now {old}")
    assert commands[retired + 1] == f"rm -f -- /etc/systemd/system/{old}"
    assert retired < commands.index("systemctl start modelfleet-kimi-local.service")
