"""Faults an operator meets, injected on the lab: two runs at once, a small file changed on the hub with its size
kept, the control node killed during the peer copy, a re-keyed host, and the registry, hub and disk failing.
Each ends with no wrong byte trusted, no leftover unit, a refusal for a changed key and one line per failing
host; a re-run after the fault is removed converges."""

import json
import os
import re
import signal
import subprocess

import pytest

import lab
from lab import STATE, ssh
from modelfleet.base.commands import modelfleet_argv, pyinfra_argv, run_pyinfra

pytestmark = pytest.mark.lab
ROOT = "/srv/models-faults"


def model_run(**fields):
    """deploys/model.py on the lab under the scenario of `fields`, its model root this module's."""
    lab.scenario.write(model_root=ROOT, **fields)
    return run_pyinfra("inventories/lab.py", "deploys/model.py", timeout=600)


def output(run) -> str:
    return run.stdout + run.stderr


def changed(run) -> int:
    total = re.search(r"Grand total\s+(\d+)\s+(\S+)", output(run))
    return 0 if total and total.group(2) == "-" else int(total.group(2)) if total else -1


def refusals(text: str) -> list[str]:
    return [line for line in text.splitlines() if "refused:" in line or "modelfleet:" in line]


def no_traceback(text: str) -> bool:
    return "Traceback (most recent call last)" not in text and "internal exception" not in text


def on_disk_matches_manifest(spec, directory: str) -> None:
    """Every file the manifest vouches for has, on disk, the size and digest it records."""
    manifest = json.loads(ssh(spec, f"cat {directory}/.modelfleet-manifest.json").stdout)
    for rel, entry in manifest["files"].items():
        size = int(ssh(spec, f"stat -c %s {directory}/{rel}").stdout)
        assert size == entry["size"], rel
        if entry.get("sha256"):
            assert ssh(spec, f"sha256sum {directory}/{rel}").stdout.split()[0] == entry["sha256"], rel


@pytest.fixture
def clean(lab_hosts):
    for spec in lab_hosts:
        ssh(spec, f"rm -rf {ROOT}")
    yield lab_hosts
    for spec in lab_hosts:
        ssh(spec, f"rm -rf {ROOT}")


def test_a_second_run_is_refused_while_the_first_holds_the_host(clean):
    specs = clean
    # The first run waits at pyinfra's confirmation prompt (no -y) with its lock held; the second starts then.
    lab.scenario.write(model_root=ROOT)
    first = subprocess.Popen(pyinfra_argv("inventories/lab.py", "deploys/model.py", yes=False),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in first.stdout:
        seen.append(line)
        if "Detected changes" in line:
            break
    try:
        second = model_run()
        text = output(second)
        assert second.returncode != 0 and no_traceback(text)
        for spec in specs:
            line = next(line for line in text.splitlines() if spec["name"] in line and "refused:" in line)
            assert f"pid {first.pid}" in line and "holds this host" in line
        assert "Starting operation: modelfleet model" not in text
    finally:
        rest, _ = first.communicate("\n", timeout=600)  # pyinfra: "Press enter to execute..."
    assert first.returncode == 0, "".join(seen) + rest
    for spec in specs:
        on_disk_matches_manifest(spec, f"{ROOT}/tiny-lab/current")
    again = model_run()
    assert again.returncode == 0 and "refused" not in output(again) and changed(again) == 0


def test_a_small_file_changed_on_the_hub_is_refused_and_current_stays(clean):
    specs = clean
    assert model_run().returncode == 0
    before = ssh(specs[0], f"readlink {ROOT}/tiny-lab/current").stdout.strip()
    config = next((STATE / "hub" / "files").glob("*/*/v1.0/config.json"))
    original = config.read_bytes()
    altered = original.replace(b"4", b"5", 1) if b"4" in original else original[:-1] + b" "
    assert len(altered) == len(original) and altered != original
    config.write_bytes(altered)  # the hub's metadata still describes the original (git blob id)
    try:
        run = model_run(revision="v1.0")
        text = output(run)
        assert run.returncode != 0 and no_traceback(text)
        for spec in specs:
            assert ssh(spec, f"readlink {ROOT}/tiny-lab/current").stdout.strip() == before
        assert any("config.json" in line and "do not match" in line for line in refusals(text)), text[-3000:]
    finally:
        config.write_bytes(original)
    healed = model_run(revision="v1.0")
    assert healed.returncode == 0, output(healed)[-3000:]
    assert ssh(specs[0], f"readlink {ROOT}/tiny-lab/current").stdout.strip() != before
    assert changed(model_run(revision="v1.0")) == 0


def fanout_state(spec) -> dict:
    out = ssh(spec, "systemctl show -p ActiveState -p RuntimeMaxUSec modelfleet-fanout-lab.service").stdout
    return dict(line.split("=", 1) for line in out.split())


def test_control_node_killed_during_the_peer_copy_leaves_no_unit_for_long(clean):
    specs = clean
    lab.scenario.write(model_root=ROOT)
    run = subprocess.Popen(pyinfra_argv("inventories/lab.py", "deploys/model.py"),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in run.stdout:
        if "Copy modelfleet/tiny-lab@" in line:  # the seed serves now; the peers copy
            run.send_signal(signal.SIGKILL)
            break
    run.wait(timeout=60)
    leftover = fanout_state(specs[0])
    if leftover.get("ActiveState") == "active":  # leaked: bounded by the transfer, not a day
        assert leftover["RuntimeMaxUSec"] not in ("infinity", "1d") and "h" not in leftover["RuntimeMaxUSec"]
    again = model_run()
    assert again.returncode == 0, output(again)[-3000:]
    assert changed(model_run()) == 0
    if leftover.get("ActiveState") == "active":
        assert "left running by an earlier run" in output(again)
    assert fanout_state(specs[0]).get("ActiveState") != "active"
    for spec in specs:
        on_disk_matches_manifest(spec, f"{ROOT}/tiny-lab/current")


def test_status_refuses_a_host_whose_key_changed(lab_hosts):
    spec = lab_hosts[1]
    key = STATE / "hosts" / spec["name"] / "ssh_host_ed25519_key"
    saved = {p: p.read_bytes() for p in (key, key.with_suffix(".pub"))}
    fresh = key.parent / "rekeyed"
    try:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(fresh)], check=True)
        for path, new in ((key, fresh), (key.with_suffix(".pub"), fresh.with_suffix(".pub"))):
            path.write_bytes(new.read_bytes())  # in place: the host sees the file through a bind mount
        subprocess.run(["docker", "exec", spec["name"], "systemctl", "restart", "ssh"], check=True)
        lab.wait_ssh(spec)
        run = subprocess.run(modelfleet_argv("status", "inventories/lab.py", "--json"), capture_output=True,
                             text=True, timeout=120)
        rows = {row["host"]: row for row in json.loads(run.stdout)}
        assert run.returncode == 1 and not rows[spec["name"]]["reachable"]
        error = rows[spec["name"]]["error"]
        assert "CHANGED" in error and f"ssh-keygen -R '{spec['address']}' -f {lab.STATE / 'known_hosts'}" in error
        assert all(rows[s["name"]]["reachable"] for s in lab_hosts if s is not spec)
    finally:
        for path, data in saved.items():
            path.write_bytes(data)
        for path in (fresh, fresh.with_suffix(".pub")):
            path.unlink(missing_ok=True)
        subprocess.run(["docker", "exec", spec["name"], "systemctl", "restart", "ssh"], check=True)
        lab.wait_ssh(spec)


def test_registry_failure_is_one_line_per_host(lab_hosts):
    lab.scenario.write(image="vllm/vllm-openai:no-such-tag", engine="vllm")
    run = run_pyinfra("inventories/lab.py", "deploys/serve.py")
    text = output(run)
    assert run.returncode != 0 and no_traceback(text)
    for spec in lab_hosts:
        lines = [line for line in refusals(text) if spec["name"] in line]
        assert len(lines) == 1 and "image digest" in lines[0] and "no-such-tag" in lines[0], text[-3000:]
    assert "Starting operation" not in text.replace("Starting operation: Pins", "")


def test_hub_unreachable_is_one_line_per_host(clean):
    run = model_run(hf_endpoint="http://127.0.0.1:9", revision="v1.0")
    text = output(run)
    assert run.returncode != 0 and no_traceback(text)
    for spec in clean:
        lines = [line for line in refusals(text) if spec["name"] in line]
        assert len(lines) == 1 and "checkpoint revision" in lines[0] and "127.0.0.1:9" in lines[0], text[-3000:]


def test_disk_full_during_a_download_is_one_line(clean):
    spec = clean[0]
    assert model_run().returncode == 0
    job = ssh(spec, f"ls {spec['config_dir']}/checkpoint-tiny-lab-*.json").stdout.split()[0]
    small = "/srv/models-full"
    ssh(spec, f"mkdir -p {small} && mount -t tmpfs -o size=1m tmpfs {small}")
    try:
        data = json.loads(ssh(spec, f"cat {job}").stdout)
        data["dest"] = f"{small}/tiny-lab"
        ssh(spec, f"cat > {job}.full.json <<'EOF'\n{json.dumps(data)}\nEOF")
        fetch = ssh(spec, f"/opt/modelfleet/hf-venv/bin/python /opt/modelfleet/bin/modelfleet_fetch.py "
                          f"{job}.full.json hub")
        lines = fetch.stderr.strip().splitlines()
        assert fetch.returncode == 1 and len(lines) == 1, fetch.stderr
        assert lines[0].startswith("modelfleet: disk full") and "Traceback" not in fetch.stderr
        assert ssh(spec, f"test -s {job}.full.json.log && echo logged").stdout.strip() == "logged"
    finally:
        ssh(spec, f"umount {small}; rm -rf {small} {job}.full.json {job}.full.json.log")


def test_peers_of_a_failed_source_say_so(clean):
    specs = clean
    # A shard changed on the hub (its size kept): the seed's download fails its sha256; the peers, which copy
    # from the seed, must name the failed source instead of timing out against a server that never started.
    shard = sorted((STATE / "hub" / "files").glob("*/*/main/*.safetensors"))[0]
    original = shard.read_bytes()
    shard.write_bytes(original[:4096] + bytes(b ^ 0xFF for b in original[4096:4100]) + original[4100:])
    try:
        run = model_run()
    finally:
        shard.write_bytes(original)
    text = output(run)
    assert run.returncode != 0 and no_traceback(text), text[-3000:]
    seed = [line for line in refusals(text) if specs[0]["name"] in line]
    assert seed and "do not match" in seed[0] and shard.name in seed[0], text[-3000:]
    for spec in specs[1:]:
        lines = [line for line in refusals(text) if spec["name"] in line]
        assert len(lines) == 1 and f"source {specs[0]['name']} failed" in lines[0], text[-3000:]
    healed = model_run()
    assert healed.returncode == 0, output(healed)[-3000:]
    assert changed(model_run()) == 0


def serve_run(**argv):
    return run_pyinfra("inventories/lab.py", "deploys/serve.py", timeout=900, **argv)


def engine_unit(spec) -> str:
    units = ssh(spec, "systemctl list-units 'modelfleet-*.service' --all --no-legend --plain").stdout.split("\n")
    return next(line.split()[0] for line in units if line and "fanout" not in line)


def test_a_drop_in_on_an_engine_unit_is_removed_and_the_engine_restarted(lab_hosts):
    spec = lab_hosts[0]
    assert serve_run().returncode == 0
    unit = engine_unit(spec)
    override = f"/etc/systemd/system/{unit}.d/override.conf"
    ssh(spec, f"mkdir -p {os.path.dirname(override)} && printf '[Service]\\nExecStart=\\nExecStart=/bin/sleep "
              f"infinity\\nRestart=always\\n' > {override} && systemctl daemon-reload && systemctl restart {unit}")
    assert "argv[]=/bin/sleep infinity" in ssh(spec, f"systemctl show -p ExecStart {unit}").stdout
    # A site that keeps its own drop-ins: refused by name, the file left alone.
    kept = serve_run(data={"unit_dropins": "keep"})
    text = output(kept)
    assert kept.returncode != 0 and no_traceback(text)
    lines = [line for line in refusals(text) if spec["name"] in line]
    assert len(lines) == 1 and override in lines[0], text[-3000:]
    assert "ExecStart" in lines[0] and "unit_dropins: keep" in lines[0]
    assert ssh(spec, f"test -f {override} && echo kept").stdout.strip() == "kept"
    # The default: removed, systemd reloaded, the engine restarted on modelfleet's unit and answering again.
    run = serve_run()
    text = output(run)
    assert run.returncode == 0 and no_traceback(text), text[-3000:]
    assert any(override in line and "removing" in line for line in refusals(text)), text[-3000:]
    assert ssh(spec, f"test -e {os.path.dirname(override)} || echo gone").stdout.strip() == "gone"
    show = ssh(spec, f"systemctl show -p ExecStart -p Restart -p DropInPaths {unit}").stdout
    assert "argv[]=/usr/bin/docker run" in show and "Restart=on-failure" in show and "DropInPaths=\n" in show
    assert ssh(spec, "pgrep -fx '/bin/sleep infinity' || echo none").stdout.strip() == "none"
    assert changed(serve_run()) == 0
    # A mask (the unit file replaced by a link to /dev/null): the file is written again, the unit runs.
    ssh(spec, f"ln -sf /dev/null /etc/systemd/system/{unit} && systemctl daemon-reload")
    assert ssh(spec, f"systemctl show -p LoadState {unit}").stdout.strip() == "LoadState=masked"
    run = serve_run()
    assert run.returncode == 0 and no_traceback(output(run)), output(run)[-3000:]
    assert ssh(spec, f"systemctl show -p LoadState -p ActiveState {unit}").stdout.split() == [
        "LoadState=loaded", "ActiveState=active"]
    assert changed(serve_run()) == 0


def litter(spec) -> list[str]:
    """Partial files, and revision directories without a manifest, under the test's model root."""
    found = ssh(spec, f"find {ROOT} -name '*.modelfleet-partial'; for d in {ROOT}/*/*/; do "
                      f"[ -f $d.modelfleet-manifest.json ] || echo $d; done 2>/dev/null").stdout
    return [line for line in found.split() if "*" not in line]


def test_a_host_restarted_mid_copy_leaves_nothing_behind(clean):
    specs = clean
    peer = specs[1]
    # A slow fan-out (1 MB/s for the group), so the peer's restart lands while its partial files are written.
    lab.scenario.write(model_root=ROOT, fanout_rate_mb_s=1)
    run = subprocess.Popen(pyinfra_argv("inventories/lab.py", "deploys/model.py"),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in run.stdout:
        seen.append(line)
        if "Copy modelfleet/tiny-lab@" in line:
            for _ in range(100):
                if any(p.endswith(".modelfleet-partial") for p in litter(peer)):
                    break
            subprocess.run(["docker", "restart", "-t", "0", peer["name"]], check=True, capture_output=True)
            break
    rest, _ = run.communicate(timeout=600)
    text = "".join(seen) + rest
    lab.wait_ssh(peer)
    assert run.returncode != 0 and no_traceback(text), text[-3000:]
    gone = [line for line in refusals(text) if "went away during" in line]
    assert len(gone) == 1 and peer["name"] in gone[0] and "Copy modelfleet/tiny-lab@" in gone[0], text[-3000:]
    assert "not loaded" not in text
    left = litter(peer)
    assert any(p.endswith(".modelfleet-partial") for p in left), left
    again = model_run()
    text = output(again)
    assert again.returncode == 0, text[-3000:]
    said = [line for line in refusals(text) if peer["name"] in line and "partial file(s)" in line]
    assert len(said) == 1 and "no longer running" in said[0], text[-3000:]
    for spec in specs:
        assert litter(spec) == [], spec["name"]
        on_disk_matches_manifest(spec, f"{ROOT}/tiny-lab/current")
    assert changed(model_run()) == 0


def test_a_source_killed_during_the_fan_out_is_named_by_its_peers(clean):
    specs = clean
    seed = specs[0]
    lab.scenario.write(model_root=ROOT, fanout_rate_mb_s=1)
    run = subprocess.Popen(pyinfra_argv("inventories/lab.py", "deploys/model.py"),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in run.stdout:
        seen.append(line)
        if "Copy modelfleet/tiny-lab@" in line:
            for _ in range(100):
                if any(p.endswith(".modelfleet-partial") for p in litter(specs[1])):
                    break
            ssh(seed, "systemctl kill --signal=KILL modelfleet-fanout-lab.service")
            break
    rest, _ = run.communicate(timeout=600)
    text = "".join(seen) + rest
    assert run.returncode != 0 and no_traceback(text), text[-3000:]
    for spec in specs[1:]:
        # Its own line (a peer's line may name it too: a receiver's server stops with its failed copy).
        lines = [line for line in refusals(text) if line.strip().startswith(f"[{spec['name']}]")]
        assert len(lines) == 1 and f"source {seed['name']} (" in lines[0], text[-3000:]
        assert "stopped during the copy" in lines[0] or "stopped answering" in lines[0], text[-3000:]
        assert "do not match" not in lines[0]
    assert not [line for line in refusals(text) if line.strip().startswith(f"[{seed['name']}]")], text[-3000:]
    assert "not loaded" not in text and "Failed to stop" not in text
    healed = model_run()
    assert healed.returncode == 0, output(healed)[-3000:]
    for spec in specs:
        assert litter(spec) == []
    assert changed(model_run()) == 0
