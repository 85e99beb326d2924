"""Faults, round 4, on the lab: a source that freezes mid-transfer (the hub double and a peer), pyinfra
SIGKILLed mid-download then an immediate plain re-run, and a bit flipped at the same size and mtime on a
holder and on a peer. Each ends with a plain re-run that converges and a next run with 0 changes; the figures
(time from a frozen source to its line, from a killed run to a converged re-run) are printed for the notes."""

import json
import signal
import subprocess
import threading
import time

import pytest

from lab import hub, scenario, ssh
from modelfleet.base.commands import pyinfra_argv, run_pyinfra
from tests.lab.test_faults_e2e import changed
from tests.lab.test_faults_e2e import output as text

pytestmark = pytest.mark.lab
ROOT = "/srv/models-round4"
STALL_S = 8
SHARD = "model-00003-of-00008.safetensors"


@pytest.fixture
def clean(lab_hosts):
    hub.reset_stats()
    for spec in lab_hosts:
        ssh(spec, f"rm -rf {ROOT}")
    yield lab_hosts
    hub.reset_stats()
    for spec in lab_hosts:
        ssh(spec, f"pkill -CONT -f 'modelfleet_fetch.py serve' ; rm -rf {ROOT}")


def fields(only: list[dict], **more) -> dict:
    return {"model_root": ROOT, "revision": "bench-64m", "stall_s": STALL_S, "only": [s["name"] for s in only],
            **more}


def model_run(only: list[dict], **more):
    scenario.write(**fields(only, **more))
    return run_pyinfra("inventories/lab.py", "deploys/model.py", timeout=600)


def fetches_left(spec) -> str:
    """Fetch processes still running (a peer server, a receiver's included, ends on its own after 2 x stall_s
    without a request and is stopped by the next run)."""
    return ssh(spec, "pgrep -af 'modelfleet_fetch.py' | grep -v -e pgrep -e 'modelfleet_fetch.py serve' "
                     "|| true").stdout.strip()


def timed_lines(argv: list[str], watch) -> tuple[int, list[tuple[float, str]]]:
    """Run `argv`, each output line with the time it came; `watch(line)` is called on each."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append((time.monotonic(), line))
        watch(proc, line)
    return proc.wait(timeout=600), lines


def test_a_frozen_hub_fails_the_host_in_one_line_within_the_deadline(clean):
    seed, peer, other = clean
    assert model_run([other]).returncode == 0  # a host of another group, converged: it goes on
    hub.reset_stats()
    hub.freeze(3 << 20)  # every body stops after 3 MiB and stays open, silent
    scenario.write(**fields([seed, peer, other]))
    last_byte = {"at": time.monotonic(), "seen": -1}
    done = threading.Event()

    def poll():  # when the hub sent its last byte
        while not done.is_set():
            served = hub.stats()["bytes_served"]
            if served != last_byte["seen"]:
                last_byte.update(at=time.monotonic(), seen=served)
            time.sleep(0.2)

    threading.Thread(target=poll, daemon=True).start()
    code, lines = timed_lines(pyinfra_argv("inventories/lab.py", "deploys/model.py"), lambda proc, line: None)
    done.set()
    out = "".join(line for _, line in lines)
    stalled = [(at, line) for at, line in lines if "no byte from the hub" in line]
    assert code != 0 and stalled, out[-3000:]
    at, line = stalled[0]
    assert f"host {seed['name']}" in line and hub.ENDPOINT in line and ".safetensors" in line, line
    assert f"for {STALL_S} s" in line and "Traceback" not in out
    print(f"\nfrozen hub: its line {at - last_byte['at']:.1f} s after the hub's last byte (deadline {STALL_S} s)")
    assert at - last_byte["at"] < STALL_S + 10
    # The run went on with the others: the peer copied from the host that held the checkpoint.
    assert ssh(peer, f"cat {ROOT}/tiny-lab/current/.modelfleet-manifest.json").returncode == 0, out[-3000:]
    assert not fetches_left(seed)
    hub.reset_stats()  # the hub answers again: a plain re-run converges, the next changes nothing
    again = model_run([seed, peer, other])
    assert again.returncode == 0, text(again)[-3000:]
    assert changed(model_run([seed, peer, other])) == 0


def test_a_frozen_peer_fails_its_receivers_in_one_line_and_a_rerun_converges(clean):
    seed, peer, _ = clean
    assert model_run([seed]).returncode == 0
    scenario.write(**fields([seed, peer], fanout_rate_mb_s=4))
    frozen = {}

    def watch(proc, line):
        if "Copy modelfleet/tiny-lab@" in line and not frozen:
            time.sleep(2)  # some bytes moved; then the seed's server freezes (stopped, its sockets open)
            ssh(seed, "pkill -STOP -f 'modelfleet_fetch.py serve'")
            frozen["at"] = time.monotonic()

    code, lines = timed_lines(pyinfra_argv("inventories/lab.py", "deploys/model.py"), watch)
    out = "".join(line for _, line in lines)
    stalled = [(at, line) for at, line in lines if "no byte from" in line and "the hub" not in line]
    assert frozen and code != 0 and stalled, out[-3000:]
    at, line = stalled[0]
    assert f"host {peer['name']}" in line and f" {seed['name']} (http" in line and ".safetensors" in line, line
    print(f"\nfrozen peer: its line {at - frozen['at']:.1f} s after the freeze (deadline {STALL_S} s)")
    assert at - frozen["at"] < STALL_S + 30
    assert not fetches_left(peer) and not ssh(peer, f"find {ROOT} -name '*.modelfleet-partial'").stdout
    ssh(seed, "pkill -CONT -f 'modelfleet_fetch.py serve'")
    again = model_run([seed, peer])
    assert again.returncode == 0, text(again)[-3000:]
    assert changed(model_run([seed, peer])) == 0


def test_pyinfra_killed_mid_download_then_a_plain_rerun_converges_at_once(clean):
    seed, _, _ = clean
    hub.freeze(3 << 20)  # the download is under way when the control node dies
    scenario.write(**fields([seed], stall_s=600))
    killed = {}

    def watch(proc, line):
        if "Fetch modelfleet/tiny-lab@" in line and not killed:
            for _ in range(50):
                if hub.stats()["bytes_served"] >= 3 << 20:
                    break
                time.sleep(0.2)
            proc.send_signal(signal.SIGKILL)
            killed["at"] = time.monotonic()

    timed_lines(pyinfra_argv("inventories/lab.py", "deploys/model.py"), watch)
    assert killed
    hub.reset_stats()
    again = model_run([seed])  # at once: no wait, no manual kill
    converged_s = time.monotonic() - killed["at"]
    assert again.returncode == 0, text(again)[-3000:]
    assert "another fetch" not in text(again)
    print(f"\nkilled run: a plain re-run converged {converged_s:.1f} s after the kill")
    assert changed(model_run([seed])) == 0


def flip(spec, path: str) -> None:
    """One bit of `path` flipped in place, its size and mtime kept."""
    script = (f"import os; p={path!r}; st=os.stat(p); f=open(p,'r+b'); f.seek(4096); b=f.read(1); f.seek(4096); "
              "f.write(bytes([b[0]^1])); f.close(); os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))")
    assert ssh(spec, f"python3 -c {json.dumps(script)}").returncode == 0


def digest(spec, path: str) -> str:
    return ssh(spec, f"sha256sum {path}").stdout.split()[0]


def test_a_bit_flipped_on_a_peer_is_named_by_reverify_and_replaced(clean):
    seed, peer, _ = clean
    assert model_run([seed, peer]).returncode == 0
    path = f"{ROOT}/tiny-lab/current/{SHARD}"
    good = digest(peer, path)
    flip(peer, path)
    bad = digest(peer, path)
    assert changed(model_run([seed, peer])) == 0  # same size and mtime: a plain run trusts it (documented)
    run = model_run([seed, peer], reverify=True)
    assert run.returncode == 0, text(run)[-3000:]
    lines = [line for line in text(run).splitlines() if "was corrupt" in line]
    assert len(lines) == 1 and f"repaired on {peer['name']}" in lines[0] and SHARD in lines[0], text(run)[-3000:]
    assert good in lines[0] and bad in lines[0]
    assert digest(peer, path) == good
    assert changed(model_run([seed, peer])) == 0


def test_a_bit_flipped_on_the_holder_names_the_peer_and_its_repair(clean):
    seed, peer, _ = clean
    assert model_run([seed]).returncode == 0
    path = f"{ROOT}/tiny-lab/current/{SHARD}"
    good = digest(seed, path)
    flip(seed, path)
    run = model_run([seed, peer])  # the peer copies the holder's bad bytes and refuses them
    # The swarm's pieces matched the digests read from the holder's (bad) copy; the whole file's check against the
    # hub's sha256 refuses it and names the holder.
    refused = [line for line in text(run).splitlines() if SHARD in line and "does not match" in line]
    assert run.returncode != 0 and refused, text(run)[-3000:]
    assert f"read from {seed['name']}" in refused[0] and f"model_reverify=true on {seed['name']}" in refused[0]
    assert not ssh(peer, f"ls {ROOT}/tiny-lab/*/{SHARD} 2>/dev/null").stdout.strip()  # removed, never kept
    fixed = model_run([seed], reverify=True)
    assert fixed.returncode == 0 and f"repaired on {seed['name']}" in text(fixed), text(fixed)[-3000:]
    assert digest(seed, path) == good
    again = model_run([seed, peer])
    assert again.returncode == 0, text(again)[-3000:]
    assert digest(peer, path) == good
    assert changed(model_run([seed, peer])) == 0
