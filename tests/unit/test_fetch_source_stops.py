"""A peer source that dies in the middle of a file: the copy names the source as stopped (a short read, a reset),
never as a checksum mismatch, and leaves no partial file; a file whose bytes are wrong stays a mismatch."""

import hashlib
import json
import subprocess
import sys

from modelfleet import FILES_DIR
from tests.helpers.listener import scripted_http

FETCH = str(FILES_DIR / "modelfleet_fetch.py")
DATA = bytes(range(256)) * 4096  # 1 MiB


def one_shot_server(body: bytes, length: int, reset: bool = False) -> str:
    """A server that answers each request with `length` announced and `body` sent, then closes (or resets)."""
    return scripted_http(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % length + body, reset=reset)


def fetch(tmp_path, url, *extra):
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"repo": "org/m", "commit": "c" * 40, "endpoint": "", "dest": str(tmp_path / "dst"),
                               "token_file": None, "files": {"model.safetensors": {
                                   "size": len(DATA), "sha256": hashlib.sha256(DATA).hexdigest(), "blob_id": None}}}))
    return subprocess.run([sys.executable, FETCH, str(job), "peer", url, *extra], capture_output=True, text=True,
                          timeout=60)


def test_a_short_read_names_the_source_as_stopped(tmp_path):
    url = one_shot_server(DATA[:300_000], len(DATA))
    run = fetch(tmp_path, url, "--source-name=gpu-07")
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 1 and len(lines) == 1, run.stderr
    assert f"source gpu-07 ({url}) stopped during the copy" in lines[0] and "300000 of 1048576 bytes" in lines[0]
    assert "do not match" not in lines[0]
    assert not list((tmp_path / "dst").glob("*.modelfleet-partial"))


def test_a_reset_connection_names_the_source_as_stopped(tmp_path):
    url = one_shot_server(DATA[:300_000], len(DATA), reset=True)
    run = fetch(tmp_path, url)
    assert run.returncode == 1 and f"source {url} stopped during the copy" in run.stderr, run.stderr
    assert "do not match" not in run.stderr


def test_wrong_bytes_of_the_right_length_stay_a_checksum_mismatch(tmp_path):
    url = one_shot_server(bytes(len(DATA)), len(DATA))
    run = fetch(tmp_path, url)
    assert run.returncode == 1 and "sent by the mirror" in run.stderr, run.stderr
    assert "do not match the sizes and checksums" in run.stderr, run.stderr
    assert "stopped during the copy" not in run.stderr
