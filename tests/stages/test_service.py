"""Stage service through pyinfra's @fake connector: the guides' command for Kimi on 8x B300, nothing sent to a
converged host, and a replica's unit under its pool's name retired."""

import hashlib  # noqa: F401

import pytest
from pyinfra.api.exceptions import PyinfraError

from modelfleet.plan.inventory import resolve
from tests.helpers.fake_hosts import IMAGE, b300_host, b300_probe, changed_ops, converged_replies, serve


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
               "@@modelfleet-state": [f"@@modelfleet-state path /etc/systemd/system/{old}",
                                      "file 644 root root " + "0" * 64,
                                      f"@@modelfleet-state unit {old}", "ActiveState=active", "UnitFileState=enabled"]}
    state = fake.run_fake([("r1", {**replica, "fake_responses": replies})], serve)
    commands = fake.executed(state, "r1")
    assert "/etc/systemd/system/modelfleet-kimi-local.service" in uploads.files
    retired = commands.index(f"systemctl disable --now {old}")
    assert commands[retired + 1] == f"rm -f -- /etc/systemd/system/{old}"
    assert retired < commands.index("systemctl start modelfleet-kimi-local.service")


def _cache_host(image=IMAGE):
    """Kimi K3.1 on 8x B300 with the restart tier (its recipe's --load-format goes to the daemon)."""
    return {**b300_host(), "weight_cache": True, "image": image}


def _converged_with_cache(fake, svc):
    """What a host whose engine and cache units run as `svc` renders them reports."""
    from modelfleet.plan import render, weight_cache

    replies = converged_replies(fake, svc)
    lines = []
    for path, content in ((f"/etc/systemd/system/{weight_cache.unit_name(svc)}", render.render_weights_unit(svc)),
                          (weight_cache.env_file(svc), render.render_weights_env(svc))):
        mode = 644 if path.endswith(".service") else 600
        lines += [f"@@modelfleet-state path {path}",
                  f"file {mode} root root {hashlib.sha256(content.encode()).hexdigest()}"]
    lines += [f"@@modelfleet-state unit {weight_cache.unit_name(svc)}", "ActiveState=active", "UnitFileState=enabled"]
    return {**replies, "@@modelfleet-state": replies["@@modelfleet-state"] + lines}


def test_the_weight_cache_starts_before_the_engine_beside_it(fake, uploads):
    host = {**_cache_host(), "fake_responses": {"@@modelfleet-probe": b300_probe(fake)}}
    commands = fake.executed(fake.run_fake([("b300-01", host)], serve), "b300-01")
    cache = "modelfleet-k31-weights.service"
    assert commands.index(f"systemctl start {cache}") < commands.index("systemctl start modelfleet-k31.service")
    assert f"systemctl enable {cache}" in commands
    unit = uploads.files[f"/etc/systemd/system/{cache}"]
    assert "preload" in unit and "--load-format fastsafetensors" in unit and "${MODELFLEET_WEIGHTS_IMAGE}" in unit
    engine = uploads.files["/etc/systemd/system/modelfleet-k31.service"]
    assert "--load-format ipc_cache" in engine and "fastsafetensors" not in engine
    assert f"\nMODELFLEET_WEIGHTS_IMAGE={IMAGE}\n" in uploads.files["/etc/modelfleet/k31-weights.env"]


def test_a_converged_cache_gets_nothing_and_an_image_only_upgrade_restarts_only_the_engine(fake, uploads):
    svc = resolve([("@fake/b300-01", _cache_host())]).hosts["@fake/b300-01"].services[0]
    replies = _converged_with_cache(fake, svc)
    state = fake.run_fake([("b300-01", {**_cache_host(), "fake_responses": replies})], serve)
    assert changed_ops(state, "b300-01") == []
    newer = "vllm/vllm-openai:v0.34.0@sha256:" + "e" * 64
    replies["@@modelfleet-state"] += [f"@@modelfleet-state image {newer}", "id=sha256:" + "2" * 64]
    commands = fake.executed(fake.run_fake([("b300-01", {**_cache_host(newer), "fake_responses": replies})],
                                           serve), "b300-01")
    assert "systemctl restart modelfleet-k31.service" in commands
    assert not [c for c in commands if c.startswith("systemctl") and "weights" in c], commands
    # Its env file takes the new image (the cache's next start uses it); its unit file is not rewritten.
    assert f"\nMODELFLEET_WEIGHTS_IMAGE={newer}\n" in uploads.files["/etc/modelfleet/k31-weights.env"]
    assert "/etc/systemd/system/modelfleet-k31-weights.service" not in uploads.files


def test_a_new_revision_restarts_the_cache_before_the_engine(fake, uploads):
    svc = resolve([("@fake/b300-01", _cache_host())]).hosts["@fake/b300-01"].services[0]
    replies = _converged_with_cache(fake, svc)
    moved = {**_cache_host(), "revision": "d" * 40}
    commands = fake.executed(fake.run_fake([("b300-01", {**moved, "fake_responses": replies})], serve), "b300-01")
    cache = "systemctl restart modelfleet-k31-weights.service"
    assert cache in commands and commands.index(cache) < commands.index("systemctl restart modelfleet-k31.service")
    assert "d" * 40 in uploads.files["/etc/systemd/system/modelfleet-k31-weights.service"]


def _pool_hosts(fake, **extra):
    """Two hosts of one data-parallel pool ('pair'), each probe with its fabric part (the recorded B300 dumps)."""
    from tests.unit.test_fabric import FABRIC

    pool = {"model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm-dp2", "pool": "pair",
            "hardware": "lab-cpu", "revision": "e" * 40, "image": IMAGE}

    def host(address, dump):
        lines = (FABRIC / dump).read_text().splitlines()
        return {**pool, "ssh_hostname": f"192.0.2.{address[-2:]}", "fabric_address": address,
                "fake_responses": {"@@modelfleet-probe": fake.probe_reply({"fabric": lines}), **extra}}

    return [("pa", host("10.0.0.11", "b300-head.txt")), ("pb", host("10.0.0.12", "b300-worker.txt"))]


def test_a_pool_started_across_hosts_counts_its_ranks_restarts_from_when_it_is_up(fake, uploads):
    """The ranks' restart counts are set back to 0 after the head's ready wait (systemctl restart keeps them), so
    only a rank that died after the pool formed restarts the pool on the next converge (units.rank_restarted)."""
    state = fake.run_fake(_pool_hosts(fake), serve)
    for name in ("pa", "pb"):
        commands = fake.executed(state, name)
        started = commands.index("systemctl start modelfleet-pair.service")
        assert commands.index("systemctl reset-failed modelfleet-pair.service") > started, commands
    head = fake.executed(state, "pa")
    assert any("/health" in c for c in head[:head.index("systemctl reset-failed modelfleet-pair.service")])


def test_a_gpu_still_held_after_the_old_engine_stopped_is_named_and_no_engine_starts_on_it(fake, uploads, caplog):
    # vLLM #57650: the engine died, its process still holds GPU memory; the new engine must not start on top.
    line = ("modelfleet: modelfleet-k31.service stopped but its GPUs are still held: GPU 3: pid 48213 "
            "(VLLM::EngineCore) holds 104000 MiB: not starting an engine on top of it (kill the process, or reset "
            "the GPU, then re-run)")
    host = {**b300_host(), "fake_responses": {"@@modelfleet-probe": b300_probe(fake),
                                              "gpus_free modelfleet-k31.service": {"stderr": [line],
                                                                                   "success": False}}}
    state = fake.run_fake([("b300-01", host)], serve, dry=True)
    with pytest.raises(PyinfraError, match="No hosts remaining"):  # its one host failed
        fake.finish(state)
    commands = fake.executed(state, "b300-01")
    check = next(c for c in commands if "gpus_free modelfleet-k31.service" in c)
    assert check.endswith("gpus_free modelfleet-k31.service 0 20 0 1 2 3 4 5 6 7")  # its 8 GPUs
    assert "systemctl start modelfleet-k31.service" not in commands
    assert [h.name for h in state.failed_hosts] == ["@fake/b300-01"]
    assert f"refused: {line.removeprefix('modelfleet: ')}" in caplog.text
    # Free GPUs: the check passes and the unit starts after it.
    host["fake_responses"].pop("gpus_free modelfleet-k31.service")
    commands = fake.executed(fake.run_fake([("b300-01", host)], serve), "b300-01")
    check = next(i for i, c in enumerate(commands) if "gpus_free modelfleet-k31.service" in c)
    assert check < commands.index("systemctl start modelfleet-k31.service")


def _flapping(fake, restarts: str, in_a_row: int | None):
    """The pool 'pair' with its worker pb's rank restarted `restarts` times by systemd since the pool was up,
    and the pool restarts in a row that rank caused so far (its count file, None: none)."""
    lines = ["@@modelfleet-state unit modelfleet-pair.service", "ActiveState=active", "UnitFileState=enabled",
             f"NRestarts={restarts}"]
    if in_a_row is not None:
        digest = hashlib.sha256(f"{in_a_row}\n".encode()).hexdigest()
        lines += ["@@modelfleet-state path /etc/modelfleet/pair.rank-restarts", f"file 644 root root {digest}"]
    head, worker = _pool_hosts(fake)
    worker[1]["fake_responses"]["@@modelfleet-state"] = lines
    return [head, worker]


def test_a_rank_that_keeps_dying_is_held_out_after_three_pool_restarts_and_named(fake, uploads, caplog):
    # The rank died again after 3 pool restarts in a row: held out, its host failed, the head goes on.
    state = fake.run_fake(_flapping(fake, "2", 3), serve)
    assert [h.name for h in state.failed_hosts] == ["@fake/pb"]
    assert ("refused: pool pair: rank on @fake/pb held out: it died again after 3 pool restarts in a row (limit 3); "
            "the pool is not restarted for it (journalctl -u modelfleet-pair.service); once fixed, remove "
            "/etc/modelfleet/pair.rank-restarts on @fake/pb and re-run") in caplog.text
    assert "modelfleet: pool pair: rank on @fake/pb held out after 3 pool restarts in a row" in caplog.text
    assert "systemd restarted its rank" not in caplog.text  # the pool is not restarted for it
    assert "systemctl start modelfleet-pair.service" in fake.executed(state, "pa")  # the head converges


def test_a_rank_that_died_counts_the_pool_restart_and_one_that_stayed_up_forgets_the_count(fake, uploads, caplog):
    state = fake.run_fake(_flapping(fake, "1", 1), serve)
    assert state.failed_hosts == set()
    assert "pool pair: systemd restarted its rank on @fake/pb (1 time)" in caplog.text
    assert uploads.files["/etc/modelfleet/pair.rank-restarts"] == "2\n"
    state = fake.run_fake(_flapping(fake, "0", 2), serve)
    assert "rm -f -- /etc/modelfleet/pair.rank-restarts" in fake.executed(state, "pb")
