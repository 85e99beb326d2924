"""The fetch script's bounds, on this machine: a source that accepts and then sends nothing fails the fetch in one
line naming host, source and file within its no-progress deadline; a fetch whose run is gone (the reader of its
stdout closed) ends at once, leaving no partial file; a lock held by a fetch whose SSH session ended is taken
over, one whose session lives is not; a server with no request for its idle time ends."""

import hashlib
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from modelfleet import FILES_DIR
from tests.helpers.listener import scripted_http

FETCH = str(FILES_DIR / "modelfleet_fetch.py")
DATA = os.urandom(1 << 20)


def frozen_source(sent: int = 100_000) -> str:
    """Accepts, answers with the full length announced, sends `sent` bytes, then nothing, the connection open."""
    return scripted_http(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(DATA) + DATA[:sent], close=False)


def job(tmp_path, stall_s: int) -> str:
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"repo": "org/m", "commit": "c" * 40, "endpoint": "", "dest": str(tmp_path / "dst"),
                                "token_file": None, "host": "gpu-09", "stall_s": stall_s,
                                "files": {"model.safetensors": {"size": len(DATA), "blob_id": None,
                                                                "sha256": hashlib.sha256(DATA).hexdigest()}}}))
    return str(path)


@pytest.mark.slow  # waits out a timeout
def test_a_source_that_freezes_fails_in_one_line_within_the_deadline(tmp_path):
    url = frozen_source()
    start = time.monotonic()
    run = subprocess.run([sys.executable, FETCH, job(tmp_path, 5), "peer", url, "--source-name=gpu-01"],
                         capture_output=True, text=True, timeout=60)
    took = time.monotonic() - start
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 1 and len(lines) == 1, run.stderr
    assert "host gpu-09: no byte from peer gpu-01" in lines[0] and "model.safetensors" in lines[0]
    assert "for 5 s" in lines[0] and "model_stall_s" in lines[0]
    assert 5 <= took < 15, took  # loaded machines are slow; the line above is the watch's, not a socket timeout
    assert not list((tmp_path / "dst").glob(".*.modelfleet-partial"))


def test_a_fetch_whose_run_is_gone_ends_at_once(tmp_path):
    """As sshd does when the control node dies: the reader of the fetch's stdout goes away."""
    url = frozen_source()
    reader, writer = os.pipe()
    # The reader is a process of its own, as sshd is: this process holds neither end while the fetch runs (a
    # process forked by an earlier test of the session would otherwise keep a copy of the reader open).
    sshd = subprocess.Popen(["cat"], stdin=reader, stdout=subprocess.DEVNULL)
    os.close(reader)
    proc = subprocess.Popen([sys.executable, FETCH, job(tmp_path, 600), "peer", url], stdout=writer,
                            stderr=subprocess.DEVNULL)
    os.close(writer)
    deadline = time.monotonic() + 60
    while not list((tmp_path / "dst").glob(".*.modelfleet-partial")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list((tmp_path / "dst").glob(".*.modelfleet-partial")), "the copy never started"
    sshd.kill()
    sshd.wait()
    gone = time.monotonic()
    assert proc.wait(timeout=10) != 0
    assert time.monotonic() - gone < 10  # its watch looks each second; the stall deadline is 600 s
    assert not list((tmp_path / "dst").glob(".*.modelfleet-partial"))


def holder(tmp_path, session_pid: int, session_start: str) -> subprocess.Popen:
    """A process holding the destination's lock with the record a fetch writes (pid, start time, session)."""
    dest = tmp_path / "dst"
    dest.mkdir(exist_ok=True)
    script = (f"import fcntl,os,sys,time; h=open({str(dest / '.modelfleet-lock')!r},'a+'); "
              "fcntl.flock(h, fcntl.LOCK_EX); "
              "start=open(f'/proc/{os.getpid()}/stat').read().rsplit(')',1)[1].split()[19]; "
              f"h.seek(0); h.truncate(); h.write(f'{{os.getpid()}} {{start}} {session_pid} {session_start}'); "
              "h.flush(); print('held', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def start_time(pid: int) -> str:
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19]


def test_a_lock_held_by_a_fetch_whose_session_ended_is_taken_over(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()  # a session process that is gone (its pid, a start time it no longer has)
    proc = holder(tmp_path, dead.pid, "12345")
    try:
        run = subprocess.run([sys.executable, FETCH, job(tmp_path, 600), "verify"], capture_output=True,
                             text=True, timeout=60)
        assert run.returncode == 1 and "another fetch" not in run.stderr, run.stderr  # verify: files missing
        assert proc.wait(timeout=5) is not None  # the orphan was stopped
    finally:
        proc.kill()


def test_a_lock_held_by_a_fetch_whose_session_lives_is_refused(tmp_path):
    proc = holder(tmp_path, os.getpid(), start_time(os.getpid()))  # this test plays its live session
    try:
        run = subprocess.run([sys.executable, FETCH, job(tmp_path, 600), "verify"], capture_output=True,
                             text=True, timeout=60)
        assert run.returncode == 1 and f"another fetch into {tmp_path / 'dst'} is running (pid {proc.pid})" \
            in run.stderr, run.stderr
        assert proc.poll() is None  # left alone
    finally:
        proc.kill()


@pytest.mark.slow  # waits out a timeout
def test_a_server_nobody_asks_ends_after_its_idle_time(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve_job = {"dir": str(tmp_path), "address": "127.0.0.1", "port": port, "token": "t" * 64, "files": [],
                 "idle_s": 2, "name": "gpu-01", "proof_key": "k" * 64}
    proc = subprocess.Popen([sys.executable, FETCH, "serve"], stdin=subprocess.PIPE)
    proc.stdin.write(json.dumps(serve_job).encode())
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0
