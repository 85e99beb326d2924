"""The swarm fan-out on the lab (model_fanout: swarm, the default): a group of four fills from one hub download
with the receivers sending each other verified pieces; a peer whose copy is bad is refused piece by piece and
named, and nothing it sent is kept; a peer's server killed mid-copy costs nothing but time. Each host's fan-out
is capped, so the copy lasts long enough to watch."""

import json
import threading
import time

import pytest

import lab
from lab import hub, scenario, ssh
from modelfleet.base.commands import run_pyinfra

pytestmark = pytest.mark.lab
ROOT = "/srv/models-swarm"
REVISION = "bench-64m"  # 8 shards of 8 MiB: one piece each


@pytest.fixture(scope="module")
def four(lab_hosts):
    """The session's three lab hosts and a fourth, removed after this module."""
    specs = lab.up(4, disks=1)
    yield specs
    lab.remove([specs[3]["name"]])


def tidy(specs):
    for spec in specs:
        ssh(spec, f"rm -rf {ROOT}")


def model_run(only, **fields):
    scenario.write(model_root=ROOT, revision=REVISION, only=[s["name"] for s in only], **fields)
    return run_pyinfra("inventories/lab.py", "deploys/model.py", extra=["-vvv"], timeout=600)


def reports(run) -> dict[str, dict]:
    import re

    return {name: json.loads(text) for name, text in
            re.findall(rf"\[({lab.PREFIX}\d+)\]\s+(\{{\"commit\".*\}})", run.stdout + run.stderr)}


def digests(spec) -> dict[str, str]:
    out = ssh(spec, f"cd {ROOT}/tiny-lab/current && sha256sum *.safetensors").stdout
    return {name: digest for digest, name in (line.split() for line in out.splitlines())}


def hub_digests(spec) -> dict[str, str]:
    manifest = json.loads(ssh(spec, f"cat {ROOT}/tiny-lab/current/.modelfleet-manifest.json").stdout)
    return {rel: entry["sha256"] for rel, entry in manifest["files"].items() if rel.endswith(".safetensors")}


def test_a_group_of_four_fills_from_one_download_with_receivers_serving_each_other(four):
    tidy(four)
    hub.reset_stats()
    run = model_run(four, fanout_rate_mb_s=8)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    seed, receivers = four[0], four[1:]
    got = reports(run)
    expected = hub_digests(seed)
    total = sum(json.loads(ssh(seed, f"cat {ROOT}/tiny-lab/current/.modelfleet-manifest.json").stdout)["files"][rel]
                ["size"] for rel in json.loads(ssh(seed, f"cat {ROOT}/tiny-lab/current/.modelfleet-manifest.json")
                                               .stdout)["files"])
    assert hub.stats()["bytes_served"] == total  # one download for the group
    sent_by_receivers = 0
    for spec in receivers:
        assert digests(spec) == expected  # every shard as the hub has it
        report = got[spec["name"]]
        assert report["ok"] and report["refused_pieces"] == [] and sum(report["bytes_by_peer"].values()) == total
        sent_by_receivers += sum(n for name, n in report["bytes_by_peer"].items() if name != seed["name"])
    # The receivers' uplinks carried part of the group's bytes: the seed sent less than three copies.
    assert sent_by_receivers > 0
    assert sum(got[s["name"]]["bytes_by_peer"][seed["name"]] for s in receivers) < 3 * total
    # Nothing of the swarm is left running or on disk: no server, no list of held pieces.
    for spec in four:
        left = ssh(spec, f"systemctl list-units --no-legend 'modelfleet-fanout-*' | grep -c running; "
                         f"ls -a {ROOT}/tiny-lab/current | grep -c -e have -e partial").stdout.split()
        assert left == ["0", "0"], (spec["name"], left)
    again = model_run(four)
    assert again.returncode == 0 and not reports(again), (again.stdout + again.stderr)[-2000:]


def test_a_peer_sending_bad_pieces_is_refused_named_and_nothing_it_sent_is_kept(four):
    seed, liar, receiver = four[:3]
    tidy(four)
    assert model_run([seed, liar]).returncode == 0
    # The liar's copy goes bad after its check: every shard changed in place, size and mtime kept, so its
    # manifest still vouches for it and its server sends those bytes.
    ssh(liar, f"cd {ROOT}/tiny-lab/current && for f in *.safetensors; do touch -r $f /tmp/mtime && "
              "printf EVIL | dd of=$f bs=1 seek=4096 conv=notrunc 2>/dev/null && touch -r /tmp/mtime $f; done")
    run = model_run([seed, liar, receiver], fanout_rate_mb_s=16)
    text = run.stdout + run.stderr
    assert run.returncode == 0, text[-3000:]
    assert digests(receiver) == hub_digests(seed)
    report = reports(run)[receiver["name"]]
    # Every shard of the liar's is bad: what was kept from it (a config file, before it was caught) is no shard.
    assert report["bytes_by_peer"][liar["name"]] < 8 << 20
    # Refused, each piece it had in flight when the first came back bad, and then never asked again.
    assert {r["peer"] for r in report["refused_pieces"]} == {liar["name"]} and len(report["refused_pieces"]) <= 2
    named = [line for line in text.splitlines() if f"sent by peer {liar['name']}" in line and "refused piece" in line]
    assert named and f"model_reverify=true on {liar['name']}" in named[0], text[-3000:]


def test_a_peer_killed_mid_copy_and_the_copy_completes_from_the_others(four):
    seed, receivers = four[0], four[1:]
    tidy(four)
    assert model_run([seed]).returncode == 0
    result = {}
    thread = threading.Thread(target=lambda: result.update(run=model_run(four, fanout_rate_mb_s=4)))
    thread.start()
    victim, killed, deadline = receivers[0], False, time.monotonic() + 300
    while thread.is_alive() and time.monotonic() < deadline and not killed:
        have = ssh(victim, f"cat {ROOT}/tiny-lab/*/.modelfleet-have.json 2>/dev/null").stdout
        # Whole files it verified (13 in all, 8 of them shards of one piece each): the others are asking it now.
        if have.count('"have": "*"') >= 8:
            ssh(victim, "systemctl kill -s KILL 'modelfleet-fanout-*'")
            killed = True
        time.sleep(0.3)
    thread.join(timeout=600)
    assert killed, "the victim never held a piece during the copy"
    run = result["run"]
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    expected = hub_digests(seed)
    for spec in receivers:
        assert digests(spec) == expected
    lost = [name for spec in receivers[1:] for name in reports(run)[spec["name"]]["peers_lost"]]
    assert victim["name"] in lost  # the others found it gone and took its pieces elsewhere
