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


def cache_job(tmp_path, dest):
    job = tmp_path / "cache-job.json"
    job.write_text(json.dumps({"repo": "engine-cache/vllm", "commit": "0123456789abcdef", "endpoint": None,
                               "dest": str(dest), "token_file": None, "files": None}))
    return job


def test_an_indexed_cache_reaches_a_peer_checked_and_a_changed_file_is_never_kept(tmp_path):
    # An engine cache as an engine leaves it: nested files of any name; modelfleet's own files stay out.
    seed = tmp_path / "seed" / "0123456789abcdef"
    (seed / "vllm" / "torch_compile_cache" / "ab12" / "rank_0_0").mkdir(parents=True)
    (seed / "vllm" / "torch_compile_cache" / "ab12" / "rank_0_0" / "model.bin").write_bytes(os.urandom(3 << 20))
    (seed / "triton").mkdir()
    (seed / "triton" / "kernel.cubin").write_bytes(b"cubin" * 1000)
    (seed / ".modelfleet-cache-key.json").write_text("{}")
    indexed = subprocess.run([sys.executable, FETCH, "index", str(seed), "engine-cache/vllm"],
                             capture_output=True, text=True)
    assert indexed.returncode == 0, indexed.stderr
    assert json.loads(indexed.stdout)["files"] == 2
    listed = json.loads((seed / ".modelfleet-manifest.json").read_text())["files"]
    assert sorted(listed) == ["triton/kernel.cubin", "vllm/torch_compile_cache/ab12/rank_0_0/model.bin"]
    assert listed["triton/kernel.cubin"]["sha256"] == hashlib.sha256(b"cubin" * 1000).hexdigest()
    proc, url = serving(seed)
    try:
        dest = tmp_path / "peer" / "0123456789abcdef"
        run = subprocess.run([sys.executable, FETCH, str(cache_job(tmp_path, dest)), "peer", url],
                             capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        for rel in listed:
            assert (dest / rel).read_bytes() == (seed / rel).read_bytes()
        assert sorted(json.loads((dest / ".modelfleet-manifest.json").read_text())["files"]) == sorted(listed)
        assert not (dest / ".modelfleet-cache-key.json").exists()  # each host writes its own
        # The engine rewrote a file after the index: the copy no longer matches the manifest, and is refused.
        (seed / "triton" / "kernel.cubin").write_bytes(b"CUBIN" * 1000)
        other = tmp_path / "peer2" / "0123456789abcdef"
        run = subprocess.run([sys.executable, FETCH, str(cache_job(tmp_path, other)), "peer", url],
                             capture_output=True, text=True)
        assert run.returncode == 1 and "do not match" in run.stderr
        assert not (other / "triton" / "kernel.cubin").exists() and not (other / ".modelfleet-manifest.json").exists()
    finally:
        proc.kill()


@pytest.mark.parametrize("rel", ["../escape", "/etc/cron.d/x", ".modelfleet-manifest.json"])
def test_a_source_manifest_naming_a_path_outside_the_cache_is_refused(tmp_path, rel):
    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / ".modelfleet-manifest.json").write_text(json.dumps({"files": {rel: {"size": 1, "sha256": "0" * 64}}}))
    proc, url = serving(seed)
    try:
        dest = tmp_path / "peer"
        run = subprocess.run([sys.executable, FETCH, str(cache_job(tmp_path, dest)), "peer", url],
                             capture_output=True, text=True)
        assert run.returncode == 1 and "refusing its copy" in run.stderr
        assert list(dest.iterdir()) == [dest / ".modelfleet-lock"]
    finally:
        proc.kill()


def test_a_source_without_a_manifest_gives_nothing(tmp_path):
    (tmp_path / "seed").mkdir()
    (tmp_path / "seed" / "kernel.cubin").write_bytes(b"x")
    proc, url = serving(tmp_path / "seed")
    try:
        run = subprocess.run([sys.executable, FETCH, str(cache_job(tmp_path, tmp_path / "peer")), "peer", url],
                             capture_output=True, text=True)
        assert run.returncode == 1 and "has no readable manifest" in run.stderr
        assert not (tmp_path / "peer" / "kernel.cubin").exists()
    finally:
        proc.kill()


def test_the_script_names_the_checkpoint_layout_as_the_package_does():
    # It runs alone on hosts (nothing of the package there), so it keeps its own copy of these names.
    from modelfleet import host_commands
    text = (FILES_DIR / "modelfleet_fetch.py").read_text()
    assert f'MANIFEST = "{host_commands.MANIFEST}"' in text
    assert f'"{host_commands.FETCH_LOCK}"' in text and f'{host_commands.PARTIAL}")' in text
