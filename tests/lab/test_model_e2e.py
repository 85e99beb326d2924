"""The model stage on the lab: one hub download per checkpoint group, peers copy and verify, re-runs move
nothing, a lost shard is fetched alone, a corrupt one is caught and re-copied, revisions and pruning, the disk
check, and the hub token kept to one 0600 file. Checkpoints go to /srv/models-e2e inside each lab host."""

import json
import re
import subprocess

import pytest

import lab
from lab import STATE, hub, ssh
from modelfleet.base.commands import run_pyinfra
from modelfleet.run.stages import model as model_stage

pytestmark = pytest.mark.lab
ROOT = "/srv/models-e2e"


def model_run(*extra, **fields):
    """deploys/model.py on the lab under the scenario of `fields`, its model root this module's unless given."""
    lab.scenario.write(**{"model_root": ROOT, **fields})
    return run_pyinfra("inventories/lab.py", "deploys/model.py", extra=extra, timeout=600)


def changed(run) -> int:
    total = re.search(r"Grand total\s+(\d+)\s+(\S+)", run.stdout + run.stderr)
    return 0 if total and total.group(2) == "-" else int(total.group(2)) if total else -1


def manifest(spec) -> dict:
    out = ssh(spec, f"cat {ROOT}/tiny-lab/current/.modelfleet-manifest.json").stdout
    return json.loads(out) if out else {}


@pytest.fixture(scope="module")
def checkpoint(lab_hosts):
    for spec in lab_hosts:
        ssh(spec, f"rm -rf {ROOT}")
    for spec in lab_hosts[1:]:  # an earlier test may have made a peer download for itself (--limit, shards)
        ssh(spec, "rm -rf /opt/modelfleet/hf-venv")
    hub.reset_stats()
    first = model_run()
    return lab_hosts, first, hub.stats()


def test_group_of_three_downloads_once_and_every_host_verifies(checkpoint):
    specs, first, stats = checkpoint
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    manifests = [manifest(spec) for spec in specs]
    assert len({m["commit"] for m in manifests}) == 1 and all(m["files"] for m in manifests)
    checkpoint_bytes = sum(entry["size"] for entry in manifests[0]["files"].values())
    assert stats["bytes_served"] == checkpoint_bytes  # hub egress 1.0x for 3 hosts
    for spec in specs:
        check = ssh(spec, f"python3 /opt/modelfleet/bin/modelfleet_fetch.py "
                          f"{spec['config_dir']}/checkpoint-tiny-lab-{manifests[0]['commit'][:12]}.json "
                          "verify --reverify")
        assert json.loads(check.stdout)["ok"], check.stdout + check.stderr
    assert ssh(specs[1], "test -e /opt/modelfleet/hf-venv || echo absent").stdout.strip() == "absent"
    # The downloader's hub client came from the hashed lock (pip --require-hashes), and says so.
    assert ssh(specs[0], f"cat {model_stage.HUB_CLIENT_BUILT}").stdout == model_stage.HUB_CLIENT_LOCK.read_text()


def test_second_run_transfers_nothing(checkpoint):
    hub.reset_stats()
    again = model_run()
    assert again.returncode == 0 and changed(again) == 0, again.stdout[-2000:]
    assert hub.stats()["bytes_served"] == 0


def test_interrupted_download_fetches_only_what_is_missing(checkpoint):
    specs = checkpoint[0]
    files = manifest(specs[0])["files"]
    shard = sorted(p for p in files if p.endswith(".safetensors"))[-1]
    # As if the fetch died after three of four shards: no manifest yet, the last shard absent.
    ssh(specs[0], f"cd {ROOT}/tiny-lab/current && rm -f .modelfleet-manifest.json {shard}")
    hub.reset_stats()
    run = model_run()
    assert run.returncode == 0, run.stdout[-2000:]
    assert hub.stats()["bytes_served"] == files[shard]["size"]


def test_corrupt_shard_on_a_peer_is_detected_and_copied_again(checkpoint):
    specs = checkpoint[0]
    files = manifest(specs[2])["files"]
    shard = sorted(p for p in files if p.endswith(".safetensors"))[0]
    ssh(specs[2], f"printf 'XXXX' | dd of={ROOT}/tiny-lab/current/{shard} bs=1 seek=4096 conv=notrunc 2>/dev/null")
    hub.reset_stats()
    run = model_run()
    assert run.returncode == 0, run.stdout[-2000:]
    assert hub.stats()["bytes_served"] == 0  # re-copied from the peer, not the hub
    digest = ssh(specs[2], f"sha256sum {ROOT}/tiny-lab/current/{shard}").stdout.split()[0]
    assert digest == files[shard]["sha256"]


def test_a_tree_fan_out_has_hosts_that_just_got_their_copy_serve_the_next(checkpoint):
    specs = checkpoint[0]
    for spec in specs[1:]:
        ssh(spec, f"rm -rf {ROOT}")
    hub.reset_stats()
    run = model_run("-vvv", fanout="tree", fanout_width=1, fanout_rate_mb_s=500)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert hub.stats()["bytes_served"] == 0  # the seed kept its copy: nothing from the hub
    # Width 1: wave 1 the seed serves the second host; wave 2 the second host serves the third.
    sources = dict(re.findall(rf"\[({lab.PREFIX}\d+)\] >>> .*modelfleet_fetch\.py \S+ peer http://([0-9.]+):", out))
    assert sources == {specs[1]["name"]: specs[0]["address"], specs[2]["name"]: specs[1]["address"]}, sources
    # The servers run unprivileged, their job (the cap, the token, the names) on stdin from a file systemd opens.
    started = re.search(r"systemd-run .*modelfleet_fetch\.py serve", out).group(0)
    assert "wave 2/2" in out and "DynamicUser=yes" in started and "StandardInput=file:" in started
    assert manifest(specs[2])["commit"] == manifest(specs[0])["commit"]
    again = model_run()
    assert again.returncode == 0 and changed(again) == 0, again.stdout[-2000:]


def test_new_revision_switches_current_and_pruning_keeps_what_is_asked(checkpoint):
    specs = checkpoint[0]
    main = manifest(specs[0])["commit"]
    run = model_run(revision="v1.0")
    assert run.returncode == 0, run.stdout[-2000:]
    v1 = manifest(specs[0])["commit"]
    assert v1 != main
    listing = ssh(specs[1], f"ls {ROOT}/tiny-lab").stdout.split()
    assert {main, v1, "current"} <= set(listing)  # the previous revision is kept for rollback
    # keep 0: the previous revision goes, once it is no longer the current one.
    pruned = model_run(revision="v1.0", keep_revisions=0)
    assert pruned.returncode == 0
    assert set(ssh(specs[1], f"ls {ROOT}/tiny-lab").stdout.split()) == {v1, "current"}


def test_hub_token_is_only_in_one_0600_file(checkpoint):
    specs, first, _ = checkpoint
    token = (STATE / "hf-token").read_text().strip()
    assert token not in first.stdout + first.stderr
    for spec in specs:
        holders = ssh(spec, f"grep -rl {token} /etc /opt /root /tmp {spec['config_dir']} {ROOT} 2>/dev/null").stdout
        for path in holders.split():
            assert ssh(spec, f"stat -c %a:%U {path}").stdout.strip() == "600:root", path
        assert bool(holders.strip()) == (spec is specs[0])  # only the host that talks to the hub has it
    assert token not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


def test_disk_too_small_is_refused_before_a_byte_moves(lab_hosts):
    spec = lab_hosts[1]
    small = "/srv/models-small"
    ssh(spec, f"mkdir -p {small} && mount -t tmpfs -o size=4m tmpfs {small}")
    try:
        hub.reset_stats()
        run = model_run("--limit", spec["name"], model_root=small)
        assert run.returncode != 0
        assert re.search(r"disk: .* needs 0\.00\d+ GB for \d+ file\(s\) of modelfleet/tiny-lab@\w+, 0\.00\d+ GB free",
                         run.stdout + run.stderr), run.stdout[-2000:]
        assert hub.stats()["bytes_served"] == 0
        assert ssh(spec, f"find {small} -type f | wc -l").stdout.strip() == "0"
    finally:
        ssh(spec, f"umount {small}")
