"""Faults, round 5, on the lab: sources that answer badly (the hub double's scenario switches: a status with
Retry-After, a cut body, another revision's bytes under the same names, a filesystem filling mid-download), a frozen
hub's leftovers and a swarm receiver whose copy failed. Each ends in one line naming the host and the real cause,
no partial file on disk, the other hosts going on, and a plain re-run that converges. The time from each fault to
its line is printed for the notes."""

import subprocess
import time

import pytest

import lab
from lab import hub, scenario, ssh
from modelfleet.base.commands import pyinfra_argv
from tests.lab.test_faults_e2e import output as text
from tests.lab.test_faults_round4_e2e import fetches_left, model_run, timed_lines

pytestmark = pytest.mark.lab
ROOT = "/srv/models-round4"  # the round-4 helpers' model root
FULL = "/srv/models-round5-full"


@pytest.fixture
def clean(lab_hosts):
    hub.reset_stats()
    for spec in lab_hosts:
        ssh(spec, f"rm -rf {ROOT}")
    yield lab_hosts
    hub.reset_stats()
    for spec in lab_hosts:
        ssh(spec, f"umount {ROOT} 2>/dev/null; rm -rf {ROOT}")


def leftovers(spec) -> str:
    """Partial files of modelfleet or of huggingface_hub under the model root."""
    return ssh(spec, f"find {ROOT} -name '*.incomplete' -o -name '*.modelfleet-partial'").stdout.strip()


def lines_with(out: str, word: str) -> list[str]:
    return [line for line in out.splitlines() if word in line]


def test_the_hub_asking_to_retry_is_obeyed_within_the_deadline_and_named_beyond_it(clean):
    seed, _, other = clean
    # 503 twice per file with Retry-After 1: the run waits where the hub asked and converges.
    run = model_run([seed], revision="main", hub_status=503, hub_retry_after=1, hub_fault_times=2)
    assert run.returncode == 0, text(run)[-3000:]
    faults = hub.stats().get("faults", {})
    assert faults and all(n == 2 for n in faults.values()), faults
    ssh(seed, f"rm -rf {ROOT}")
    hub.reset_stats()
    # 429 asking for 600 s, beyond the deadline (model_stall_s 8): one line at once naming host, hub and status.
    scenario.write(model_root=ROOT, revision="main", stall_s=8, only=[seed["name"]],
                   hub_status=429, hub_retry_after=600)
    started = time.monotonic()
    code, lines = timed_lines(pyinfra_argv("inventories/lab.py", "deploys/model.py"), lambda proc, line: None)
    out = "".join(line for _, line in lines)
    named = [(at, line) for at, line in lines if "HTTP 429" in line]
    assert code != 0 and named and "Traceback" not in out, out[-3000:]
    at, line = named[0]
    assert f"host {seed['name']}" in line and hub.ENDPOINT in line and "retry after 600 s" in line, line
    assert "froze" not in out and "SFTP" not in out
    answered = hub.stats()["first_fault_at"] - (time.time() - time.monotonic())
    print(f"\n429 Retry-After 600: its line {at - answered:.1f} s after the hub's first 429 "
          f"({at - started:.1f} s after the run started)")
    assert at - answered < 10
    assert not leftovers(seed) and not fetches_left(seed)
    again = model_run([seed, other], revision="main")
    assert again.returncode == 0, text(again)[-3000:]


def test_a_cut_body_resumes_and_another_revisions_bytes_are_refused_by_digest(clean):
    seed, _, _ = clean
    run = model_run([seed], revision="main", hub_cut_after=1 << 20, hub_fault_times=1)  # every file cut once
    assert run.returncode == 0, text(run)[-3000:]
    assert hub.stats().get("faults") and not leftovers(seed)
    ssh(seed, f"rm -rf {ROOT}")
    started = time.monotonic()
    run = model_run([seed], revision="main", hub_swap="v1.0")  # same names and sizes, v1.0's bytes
    out = text(run)
    refused = lines_with(out, "do not match")
    assert run.returncode != 0 and refused and "Traceback" not in out, out[-3000:]
    assert ".safetensors" in refused[0] and hub.ENDPOINT in refused[0], refused[0]
    print(f"\nswapped revision: refused {time.monotonic() - started:.1f} s after the run started")
    shards = ssh(seed, f"find {ROOT} -name '*.safetensors'").stdout.strip()
    assert not shards and not leftovers(seed), shards  # none of the wrong bytes kept
    again = model_run([seed], revision="main")
    assert again.returncode == 0, text(again)[-3000:]


def test_a_frozen_hub_leaves_no_partial_file_of_huggingface_hub(clean):
    seed, _, _ = clean
    hub.freeze(1 << 20)
    run = model_run([seed], revision="main")
    assert run.returncode != 0 and lines_with(text(run), "no byte from the hub"), text(run)[-3000:]
    assert not leftovers(seed), leftovers(seed)
    assert not fetches_left(seed)
    hub.reset_stats()
    assert model_run([seed], revision="main").returncode == 0


def test_the_filesystem_filling_during_a_hub_download_is_one_line_and_nothing_is_left(clean):
    seed, _, other = clean
    ssh(seed, f"mkdir -p {ROOT} && mount -t tmpfs -o size=12m tmpfs {ROOT}")
    hub.freeze(1 << 20)  # the download is under way when the disk fills
    scenario.write(model_root=ROOT, revision="main", only=[seed["name"], other["name"]])
    filled = {}

    def watch(proc, line):
        if "Fetch modelfleet/tiny-lab@" in line and not filled:
            for _ in range(50):
                if hub.stats()["bytes_served"] >= 1 << 20:
                    break
                time.sleep(0.2)
            ssh(seed, f"dd if=/dev/zero of={ROOT}/filler bs=1M count=12 2>/dev/null; true")
            filled["at"] = time.monotonic()
            hub.reset_stats()

    code, lines = timed_lines(pyinfra_argv("inventories/lab.py", "deploys/model.py"), watch)
    out = "".join(line for _, line in lines)
    named = [(at, line) for at, line in lines if "disk full on host" in line]
    assert filled and code != 0 and named and "Traceback" not in out, out[-3000:]
    at, line = named[0]
    assert f"host {seed['name']}" in line and f"filesystem {ROOT}" in line and "bytes needed" in line, line
    print(f"\ndisk full: its line {at - filled['at']:.1f} s after the filesystem filled")
    assert not leftovers(seed) and not fetches_left(seed)
    ssh(seed, f"rm -f {ROOT}/filler")
    again = model_run([seed, other], revision="main")
    assert again.returncode == 0, text(again)[-3000:]


def test_a_swarm_receiver_whose_copy_failed_stops_serving_with_it(clean):
    seed, peer, _ = clean
    assert model_run([seed], revision="main").returncode == 0
    ssh(peer, f"mkdir -p {ROOT} && mount -t tmpfs -o size=12m tmpfs {ROOT}")
    scenario.write(model_root=ROOT, revision="main", only=[seed["name"], peer["name"]], fanout_rate_mb_s=1)
    filled = {}

    def watch(proc, line):
        if "Copy modelfleet/tiny-lab@" in line and not filled:
            time.sleep(1)
            ssh(peer, f"dd if=/dev/zero of={ROOT}/filler bs=1M count=12 2>/dev/null; true")
            filled["at"] = time.monotonic()

    code, lines = timed_lines(pyinfra_argv("inventories/lab.py", "deploys/model.py"), watch)
    out = "".join(line for _, line in lines)
    named = [(at, line) for at, line in lines if "disk full on host" in line]
    assert filled and code != 0 and named, out[-3000:]
    print(f"\nswarm receiver's disk full: its line {named[0][0] - filled['at']:.1f} s after the filesystem filled")
    serving = ssh(peer, "systemctl is-active modelfleet-fanout-lab").stdout.strip()
    assert serving != "active", serving  # its server went with its copy, not at its idle timeout
    assert not leftovers(peer) and not fetches_left(peer)
    ssh(peer, f"rm -f {ROOT}/filler")
    again = model_run([seed, peer], revision="main")
    assert again.returncode == 0, text(again)[-3000:]


def test_a_host_killed_while_the_run_writes_its_job_file_is_named_as_gone(clean):
    seed, peer, _ = clean
    hub.freeze(1 << 20)  # the seed's download holds the run while the receiver goes down
    scenario.write(model_root=ROOT, revision="main", stall_s=60, only=[seed["name"], peer["name"]])
    killed = {}

    def watch(proc, line):
        if "Fetch modelfleet/tiny-lab@" in line and not killed:
            for _ in range(50):
                if hub.stats()["bytes_served"] >= 1 << 20:
                    break
                time.sleep(0.2)
            subprocess.run(["docker", "stop", "-t", "0", peer["name"]], capture_output=True, check=True)
            killed["at"] = time.monotonic()
            hub.reset_stats()

    try:
        code, lines = timed_lines(pyinfra_argv("inventories/lab.py", "deploys/model.py"), watch)
    finally:
        subprocess.run(["docker", "start", peer["name"]], capture_output=True, check=True)
        lab.wait_ssh(peer, timeout_s=120)
    out = "".join(line for _, line in lines)
    named = [(at, line) for at, line in lines if "stopped answering over SSH" in line]
    assert killed and code != 0 and named, out[-3000:]
    at, line = named[0]
    assert f"host {peer['name']}" in line, line
    assert "SFTP" not in out and "Traceback" not in out, out[-3000:]
    print(f"\nhost killed: its line {at - killed['at']:.1f} s after the kill")
    assert ssh(seed, f"cat {ROOT}/tiny-lab/current/.modelfleet-manifest.json").returncode == 0  # the seed went on
    again = model_run([seed, peer], revision="main")
    assert again.returncode == 0, text(again)[-3000:]
