"""An air-gapped site on the lab: `modelfleet mirror` builds the mirror from the hub double, the hub double is
stopped, and a fresh host whose model_source is the mirror (served over HTTP) fetches the revision from it and
verifies it; then a host that holds the revision is a mirror source itself (`--from-host`, over SSH), still
without the hub. Checkpoints go to /srv/models-mirror-e2e inside the host."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import lab
from lab import STATE, daemons, hub, ssh
from modelfleet.base.commands import run_modelfleet, run_pyinfra

pytestmark = pytest.mark.lab
ROOT = "/srv/models-mirror-e2e"
MANIFEST = ".modelfleet-manifest.json"


def hub_stopped() -> None:
    """Stop this lab's hub double (its whole process group) and wait until its port is closed."""
    pid = int((STATE / "hub.pid").read_text())
    os.killpg(pid, signal.SIGTERM)
    for _ in range(100):
        if not daemons.port_open(hub.LISTEN):
            return
        time.sleep(0.1)
    raise AssertionError(f"the hub double still answers on {hub.LISTEN}")


def serving(directory: Path) -> tuple[subprocess.Popen, str]:
    """The mirror as a site serves it: any static HTTP server (the lab's hosts share this machine's loopback)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory",
                             str(directory), str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for _ in range(100):
        if daemons.port_open(f"127.0.0.1:{port}"):
            return proc, f"http://127.0.0.1:{port}"
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the mirror's HTTP server did not start")


def files_of(manifest_path: Path | str, text: str | None = None) -> dict:
    manifest = json.loads(text if text is not None else Path(manifest_path).read_text())
    return {path: entry["sha256"] for path, entry in manifest["files"].items()}


def test_a_fresh_host_fetches_the_revision_from_the_mirror_with_the_hub_stopped(lab_hosts, tmp_path, scenario):
    spec = lab_hosts[0]
    ssh(spec, f"rm -rf {ROOT}")
    scenario(model_root=ROOT)
    built = run_modelfleet("mirror", "inventories/lab.py", str(tmp_path / "mirror"), "--limit", spec["name"],
                           timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    [revision] = json.loads(built.stdout)["revisions"]
    commit = revision["commit"]
    mirrored = files_of(tmp_path / "mirror" / "modelfleet/tiny-lab" / commit / MANIFEST)
    assert revision["copied"] == len(mirrored) > 4 and "verified" in built.stderr
    again = run_modelfleet("mirror", "inventories/lab.py", str(tmp_path / "mirror"), "--limit", spec["name"],
                           timeout=300)
    assert again.returncode == 0 and json.loads(again.stdout)["copied"] == 0, again.stderr[-2000:]

    server, url = serving(tmp_path / "mirror")
    hub_stopped()
    try:
        scenario(model_root=ROOT, revision=commit)  # a mirror has commits, not branches
        run = run_pyinfra("inventories/lab.py", "deploys/model.py", limit=[spec["name"]],
                          data={"model_source": url}, timeout=600)
        out = run.stdout + run.stderr
        assert run.returncode == 0, out[-4000:]
        assert f"from {url}/modelfleet/tiny-lab/{commit}/" in out
        host_manifest = ssh(spec, f"cat {ROOT}/tiny-lab/current/{MANIFEST}").stdout
        assert json.loads(host_manifest)["commit"] == commit
        assert files_of(None, host_manifest) == mirrored  # every file, checked against the mirror's sha256
        assert ssh(spec, f"test -e {spec['config_dir']}/hf-token || echo absent").stdout.strip() == "absent"

        # The host now holds the revision verified: a mirror source of its own, over SSH, with no hub.
        copied = run_modelfleet("mirror", "inventories/lab.py", str(tmp_path / "from-host"), "--limit", spec["name"],
                                "--from-host", spec["name"], timeout=300)
        assert copied.returncode == 0, copied.stderr[-3000:]
        summary = json.loads(copied.stdout)
        assert summary["source"] == f"host {spec['name']}" and summary["copied"] == len(mirrored)
        assert files_of(tmp_path / "from-host" / "modelfleet/tiny-lab" / commit / MANIFEST) == mirrored
    finally:
        server.terminate()
        server.wait(10)
        hub.ensure(STATE, lab.LAB_DIR)  # the later tests' hub
        ssh(spec, f"rm -rf {ROOT}")
    served = server.stderr.read()
    assert all(f"GET /modelfleet/tiny-lab/{commit}/{path} " in served for path in mirrored), served[-2000:]
