"""The fetch script's peer server and client on this machine (loopback): a copy verifies against the hub's
sha256, and a send cap holds the server to its rate."""

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from modelfleet import FILES_DIR

FETCH = str(FILES_DIR / "modelfleet_fetch.py")
SIZE = 16 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def source(tmp_path):
    data = bytes(range(256)) * (SIZE // 256)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "model.safetensors").write_bytes(data)
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"repo": "org/m", "commit": "c" * 40, "endpoint": "", "dest": str(tmp_path / "dst"),
                               "token_file": None, "files": {"model.safetensors": {
                                   "size": SIZE, "sha256": hashlib.sha256(data).hexdigest(), "blob_id": None}}}))
    return tmp_path, job


def serving(directory, *rate: str):
    port = free_port()
    proc = subprocess.Popen([sys.executable, FETCH, "serve", str(directory), "127.0.0.1", str(port), *rate])
    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).read()  # its listing, as the unit's probe
            return proc, f"http://127.0.0.1:{port}/"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("the peer server did not start")


@pytest.mark.parametrize("rate_mb_s", [None, 40])
def test_a_peer_copy_verifies_and_a_capped_server_keeps_to_its_rate(source, rate_mb_s):
    tmp_path, job = source
    proc, url = serving(tmp_path / "src", *([str(rate_mb_s)] if rate_mb_s else []))
    try:
        start = time.monotonic()
        run = subprocess.run([sys.executable, FETCH, str(job), "peer", url], capture_output=True, text=True)
        seconds = time.monotonic() - start
    finally:
        proc.kill()
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["ok"]
    if rate_mb_s:  # 16 MiB at 40 MB/s: four 4 MiB chunks, the last three each after its slot
        assert seconds >= 3 * (4 << 20) / (rate_mb_s * 1e6) * 0.95, seconds


def test_the_server_queues_every_peer_stream_connecting_at_once(source):
    """A group's peers open WORKERS streams each at the same moment: a backlog of 5 (http.server's default)
    drops the rest of the SYNs and each waits a second for TCP's retransmit. With the server stopped, every
    connection must still complete its handshake in the kernel's queue."""
    tmp_path, _ = source
    proc, url = serving(tmp_path / "src")
    port = int(url.rsplit(":", 1)[1].strip("/"))
    os.kill(proc.pid, signal.SIGSTOP)
    sockets = []
    try:
        for _ in range(48):  # six peers x 8 streams
            s = socket.socket()
            s.settimeout(0.3)
            sockets.append(s)
            s.connect(("127.0.0.1", port))
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        for s in sockets:
            s.close()
