"""The fan-out as an attacker on the pool network meets it, on the lab: a peer (or anyone) asking a holder's
server without the run's token, a process squatting the fan-out port before the wave, and a symlink an engine
container planted in its cache. Each test asserts on what the attacker got: status codes and bytes received,
and what the honest peers stored."""

import json
import os
import shlex
import threading
import time

import pytest

from lab import scenario, ssh
from modelfleet import REPO_ROOT
from modelfleet.base.commands import run_pyinfra
from modelfleet.host.transfer import FANOUT_PORT

pytestmark = pytest.mark.lab
ROOT = "/srv/models-trust"
SHARD = "model-00001-of-00008.safetensors"
SQUATTER = "lab-fanout-squatter"


def tidy(specs: list[dict]) -> None:
    for spec in specs:
        ssh(spec, f"rm -rf {ROOT}; systemctl stop {SQUATTER} 2>/dev/null || true")


@pytest.fixture
def clean(lab_hosts):
    tidy(lab_hosts)
    yield lab_hosts
    tidy(lab_hosts)


def model_run(only: list[dict], **fields):
    scenario.write(model_root=ROOT, revision="bench-64m", only=[s["name"] for s in only], **fields)
    return run_pyinfra("inventories/lab.py", "deploys/model.py", timeout=600)


def raw_get(spec: dict, address: str, path: str, header: str = "") -> tuple[int, int]:
    """From lab host `spec`: the HTTP status (0: nothing listens) and the number of body bytes that
    `address`'s fan-out port gives for `path` (sent as it is, `..` included)."""
    extra = f"-H {shlex.quote(header)}" if header else ""
    out = ssh(spec, f"curl -s --path-as-is --max-time 10 {extra} -o /tmp/attacker-got -w '%{{http_code}} "
                    f"%{{size_download}}' http://{address}:{FANOUT_PORT}{path}; rm -f /tmp/attacker-got")
    status, size = (out.stdout.split() + ["0", "0"])[:2]
    return int(status), int(size)


def test_a_peer_asking_without_the_token_gets_no_byte(clean):
    seed, peer, attacker = clean
    assert model_run([seed]).returncode == 0
    # The wave, slowed by a send cap so the attacker asks while the seed serves its peer.
    result = {}
    thread = threading.Thread(target=lambda: result.update(run=model_run([seed, peer], fanout_rate_mb_s=4)))
    thread.start()
    tried = {}
    deadline = time.monotonic() + 120
    while thread.is_alive() and time.monotonic() < deadline and not tried:
        status, _ = raw_get(attacker, seed["address"], f"/{SHARD}")
        if status:  # the server is up: ask as an attacker would
            tried = {what: raw_get(attacker, seed["address"], path, header) for what, path, header in [
                ("no token", f"/{SHARD}", ""), ("guessed token", f"/{SHARD}", "Authorization: Bearer " + "0" * 64),
                ("listing", "/", ""), ("listing with a guess", "/", "Authorization: Bearer x"),
                ("manifest", "/.modelfleet-manifest.json", ""), ("outside", "/../../../etc/shadow", "")]}
        time.sleep(0.2)
    thread.join(timeout=600)
    assert result["run"].returncode == 0, (result["run"].stdout + result["run"].stderr)[-3000:]
    assert tried, "the attacker never found the seed's server up during the wave"
    assert tried == dict.fromkeys(tried, (401, 0)), tried  # refused, and not one byte
    # The honest peer got every byte, checked.
    manifest = json.loads(ssh(peer, f"cat {ROOT}/tiny-lab/current/.modelfleet-manifest.json").stdout)
    assert len(manifest["files"]) >= 8


def test_a_squatter_on_the_fanout_port_is_named_and_no_peer_stores_its_files(clean):
    seed, peer, _ = clean
    assert model_run([seed]).returncode == 0
    # An unprivileged user on the seed binds the fan-out port first and serves its own bytes under the
    # checkpoint's names (any path answers 200).
    ssh(seed, "mkdir -p /tmp/squat && for i in 1 2 3 4 5 6 7 8; do head -c 8388608 /dev/zero > "
              "/tmp/squat/model-0000$i-of-00008.safetensors; done && chmod -R a+rX /tmp/squat")
    started = ssh(seed, f"systemd-run --unit={SQUATTER} --uid=nobody --gid=nogroup --working-directory=/tmp/squat "
                        f"python3 -m http.server {FANOUT_PORT} --bind {seed['address']} && sleep 1 && "
                        f"ss -Hltnp sport = :{FANOUT_PORT}")
    assert f"{seed['address']}:{FANOUT_PORT}" in started.stdout, started.stdout + started.stderr
    pid = ssh(seed, f"systemctl show -p MainPID --value {SQUATTER}").stdout.strip()
    run = model_run([seed, peer])
    text = run.stdout + run.stderr
    assert run.returncode != 0
    lines = [line for line in text.splitlines()
             if f"fan-out port {seed['address']}:{FANOUT_PORT} is held by" in line]
    assert lines and f"host {seed['name']}" in lines[0] and f"python3 pid {pid}" in lines[0], text[-3000:]
    assert "uid 65534" in lines[0]
    # What the peer stored: none of the squatter's bytes under any name.
    stored = ssh(peer, f"find {ROOT} -type f -name '*.safetensors' -exec sha256sum {{}} + 2>/dev/null").stdout
    zeros = ssh(seed, "sha256sum /tmp/squat/model-00001-of-00008.safetensors").stdout.split()[0]
    assert zeros not in stored, stored
    assert f"copy source {seed['name']} failed earlier in this run" in text
    # With the squatter gone, a plain re-run converges.
    ssh(seed, f"systemctl stop {SQUATTER}")
    again = model_run([seed, peer])
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]


def serve(specs: list[dict], tmp_path, **fields):
    scenario.write(only=[s["name"] for s in specs], engine="vllm", **fields)
    env = {**os.environ, "MODELFLEET_REPORTS": str(tmp_path / "reports")}
    return run_pyinfra("inventories/lab.py", "deploys/serve.py", cwd=REPO_ROOT, env=env, timeout=900)


def test_a_symlink_planted_in_an_engine_cache_is_named_and_nothing_outside_the_tree_is_served(lab_hosts, tmp_path):
    holder, peer = lab_hosts[0], lab_hosts[1]
    try:
        planted_cache_is_refused(holder, peer, tmp_path)
    finally:  # leave the hosts as the other lab tests expect them: no link, no engine running
        for spec in (holder, peer):
            ssh(spec, f"find {spec['model_root']}/.cache/vllm -maxdepth 2 -type l -delete; "
                      "systemctl stop 'modelfleet-tiny-*'")


def planted_cache_is_refused(holder: dict, peer: dict, tmp_path) -> None:
    for spec in (holder, peer):  # engines stopped: the first serve starts one, which compiles a cache
        ssh(spec, f"systemctl stop 'modelfleet-tiny-*'; rm -rf {spec['model_root']}/.cache/vllm")
    first = serve([holder], tmp_path)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    root = f"{holder['model_root']}/.cache/vllm"
    key = ssh(holder, f"ls {root} | grep -Ex '[0-9a-f]{{16}}'").stdout.split()[0]
    # What the engine container (root in its cache directory) plants: links to the host's secrets.
    secret = ssh(holder, "ls /etc/modelfleet/*/*.env /etc/modelfleet/*.env 2>/dev/null | head -1").stdout.strip() \
        or "/etc/shadow"
    ssh(holder, f"cd {root}/{key} && ln -sfn {secret} innocent.json && ln -sfn / rootfs")
    run = serve([holder, peer], tmp_path)
    text = run.stdout + run.stderr
    named = [line for line in text.splitlines() if "holds what no cache may hold" in line]
    assert named and "innocent.json" in named[0] and "rootfs" in named[0] and holder["name"] in named[0], text[-4000:]
    # What the peer stored: nothing from outside the holder's tree, not even a link.
    peer_dir = f"{peer['model_root']}/.cache/vllm/{key}"
    got = ssh(peer, f"find {peer_dir} ! -type d 2>/dev/null | sort").stdout.split()
    assert not [p for p in got if p.endswith(("innocent.json", "rootfs")) or "/rootfs/" in p], got
    assert ssh(peer, f"grep -rl root: {peer_dir} 2>/dev/null").stdout == ""
    # And the holder's server, asked for the links by name with the attacker's best guess, gives no byte.
    assert raw_get(peer, holder["address"], "/innocent.json")[1] == 0


VICTIM = "/root/victim-ssh"  # stands in for /root/.ssh: the attack aims at root's keys


def test_a_directory_link_in_a_receivers_cache_is_refused_and_roots_keys_stay_as_they_were(lab_hosts, tmp_path):
    holder, peer = lab_hosts[0], lab_hosts[1]
    try:
        receivers_link_is_refused(holder, peer, tmp_path)
    finally:  # as the other lab tests expect the hosts: no link, no victim, no engine running
        for spec in (holder, peer):
            ssh(spec, f"rm -rf {spec['model_root']}/.cache/vllm {VICTIM}; systemctl stop 'modelfleet-tiny-*'")


def receivers_link_is_refused(holder: dict, peer: dict, tmp_path) -> None:
    for spec in (holder, peer):
        ssh(spec, f"systemctl stop 'modelfleet-tiny-*'; rm -rf {spec['model_root']}/.cache/vllm {VICTIM}")
    first = serve([holder], tmp_path)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    root = f"{holder['model_root']}/.cache/vllm"
    key = ssh(holder, f"ls {root} | grep -Ex '[0-9a-f]{{16}}'").stdout.split()[0]
    # The holder's engine writes a file where the receiver's engine will have a link: indexed and served as any.
    ssh(holder, f"mkdir -p {root}/{key}/inductor && echo 'ssh-ed25519 AAAA attacker' > {root}/{key}/inductor/"
                "authorized_keys")
    # The receiver's own engine (an earlier start with this key, in the directories modelfleet made for it)
    # left only a link in its key directory: no regular file, so the host counted as one to fill.
    peer_dir = f"{peer['model_root']}/.cache/vllm/{key}"
    ssh(peer, f"mkdir -p {VICTIM} {peer_dir} && echo 'ssh-ed25519 AAAA root' > {VICTIM}/authorized_keys && "
              f"touch {peer_dir}/../.modelfleet-owned {peer_dir}/.modelfleet-owned && "
              f"ln -sfn {VICTIM} {peer_dir}/inductor")
    before = ssh(peer, f"ls -A {VICTIM}; sha256sum {VICTIM}/authorized_keys").stdout
    run = serve([holder, peer], tmp_path)
    text = run.stdout + run.stderr
    said = [line for line in text.splitlines() if "modelfleet:" in line or "rror" in line or "refus" in line]
    # What the attacker got: root's keys as they were, nothing beside them, the link as it was planted.
    assert ssh(peer, f"ls -A {VICTIM}; sha256sum {VICTIM}/authorized_keys").stdout == before, said
    assert ssh(peer, f"readlink {peer_dir}/inductor").stdout.strip() == VICTIM
    assert run.returncode != 0, said
    named = [line for line in text.splitlines() if "holds what no cache may hold" in line]
    assert named and f"inductor (a symlink to {VICTIM})" in named[0] and peer_dir in named[0], said
