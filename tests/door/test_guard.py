"""The guard needs nothing in the user's file: the checkout's config.py refuses a malformed inventory written
the plain pyinfra way (lists of hosts, no modelfleet line) through the real `pyinfra` command, exit 2, before
any connection; `--data` overrides and `--group-data` folders are checked the same way."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.listener import CountingListener

pytestmark = pytest.mark.slow  # pyinfra's own CLI in child processes

ROOT = Path(__file__).resolve().parents[2]


def good(port: int, **changes) -> dict:
    data = {"ssh_hostname": "127.0.0.1", "ssh_port": port, "hardware": "h200", "model": "qwen3-8b",
            "engine": "vllm", "gpu_stack": False}
    return {k: v for k, v in {**data, **changes}.items() if v is not ...}


BROKEN = [
    ("unknown model", {"model": "nope"}, []),
    ("typo", {"gpu_cout": 1}, []),
    ("missing hardware", {"hardware": ...}, []),
    ("open endpoint without key", {"bind_address": "0.0.0.0"}, []),
    ("reserved port from --data", {}, ["--data", "port=22"]),
    ("bad value from --group-data", {}, ["--group-data", "{extra}"]),
]


@pytest.mark.parametrize("case,change,options", BROKEN, ids=[c[0] for c in BROKEN])
def test_plain_inventory_refused_with_no_connection(tmp_path, case, change, options):
    listener = CountingListener()
    hosts = [(f"h{i}", {**good(listener.port, **change), "port": 8000 + i}) for i in range(3)]
    inv = tmp_path / "plain.py"
    inv.write_text(f"gpu_hosts = {hosts!r}\n")  # the plain pyinfra way: no modelfleet line
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "all.py").write_text("model_root = 'relative/path'\n")
    options = [o.format(extra=extra) for o in options]
    run = subprocess.run([sys.executable, "-m", "pyinfra", "-y", *options, str(inv), "deploys/serve.py"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    listener.sock.close()
    out = run.stdout + run.stderr
    assert run.returncode == 2, out[-3000:]
    assert "nothing was touched" in out and "host h0" in out and "Traceback" not in out
    assert listener.count == 0


def test_valid_plain_inventory_passes_the_guard(tmp_path):
    """The guard lets a valid inventory through: pyinfra goes on to connect (here: to a port that refuses)."""
    listener = CountingListener()
    inv = tmp_path / "plain.py"
    inv.write_text(f"gpu_hosts = {[('h0', good(listener.port))]!r}\n")
    run = subprocess.run([sys.executable, "-m", "pyinfra", "-y", str(inv), "deploys/preflight.py"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    listener.sock.close()
    assert "nothing was touched" not in run.stdout + run.stderr
    assert listener.count >= 1
