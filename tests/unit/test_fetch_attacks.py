"""The fetch script and its peer server as an attacker meets them, run for real on this machine (loopback, tmp
trees): an engine container that planted links in its cache directory, a port squatter relaying the stage's
challenge to another server of the run, a source that streams more than a file holds, and a flood of idle
connections. Each test asserts on what the attacker got: the victim file's bytes, what crossed the relay, how
many bytes were written, the server's threads and lifetime."""

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from modelfleet.files.modelfleet_fetch import CHALLENGE, proof
from tests.helpers.fetch_peer import FETCH, KEY, NAME, TOKEN, serving

ROOTS_KEYS = b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIRootOwnKey root@host\n"


def tree_of(directory) -> dict:
    """Every entry below `directory` as (kind, bytes) without following a link: what is there, exactly."""
    out = {}
    for top, dirs, names in os.walk(directory):
        for name in dirs + names:
            path = os.path.join(top, name)
            rel = os.path.relpath(path, directory)
            if os.path.islink(path):
                out[rel] = ("link", os.readlink(path))
            elif os.path.isfile(path):
                out[rel] = ("file", open(path, "rb").read())
    return out


def test_a_lock_link_planted_in_a_cache_leaves_its_target_whole_when_the_holder_indexes(tmp_path):
    """`.modelfleet-lock -> /etc/shadow` in the engine's cache: root's index opened it, truncated it and wrote a
    pid into the victim before any check ran."""
    victim = tmp_path / "shadow"
    victim.write_text("root:$6$secret:19000:0:99999:7:::\n")
    cache = tmp_path / "0123456789abcdef"
    (cache / "triton").mkdir(parents=True)
    (cache / "triton" / "kernel.cubin").write_bytes(b"k" * 100)
    (cache / ".modelfleet-lock").symlink_to(victim)
    run = subprocess.run([sys.executable, FETCH, "index", str(cache), "engine-cache/vllm"], capture_output=True,
                         text=True, timeout=60)
    assert victim.read_text() == "root:$6$secret:19000:0:99999:7:::\n"  # what the attacker got: nothing
    line = run.stderr.strip()
    assert run.returncode == 1 and len(line.splitlines()) == 1, run.stderr
    assert f"{cache}/.modelfleet-lock is a symlink (to {victim})" in line
    assert not (cache / ".modelfleet-manifest.json").exists()


def test_a_directory_link_planted_in_a_receivers_cache_is_refused_and_nothing_lands_outside(tmp_path):
    """The receiver's own engine planted `inductor -> /root/.ssh` (no regular file: the cache counted as empty);
    the holder's engine wrote `inductor/authorized_keys`, indexed and served as any cache file. The copy followed
    the link and replaced root's keys."""
    ssh_dir = tmp_path / "root-ssh"
    ssh_dir.mkdir()
    (ssh_dir / "authorized_keys").write_bytes(ROOTS_KEYS)
    before = tree_of(ssh_dir)
    holder = tmp_path / "holder" / "0123456789abcdef"
    (holder / "inductor").mkdir(parents=True)
    attackers = b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAttackerKey attacker\n"
    (holder / "inductor" / "authorized_keys").write_bytes(attackers)
    indexed = subprocess.run([sys.executable, FETCH, "index", str(holder), "engine-cache/vllm"],
                             capture_output=True, text=True, timeout=60)
    assert indexed.returncode == 0, indexed.stderr  # a plain file on the holder: nothing to refuse there
    listed = json.loads(indexed.stdout)["manifest"]
    receiver = tmp_path / "receiver" / "0123456789abcdef"
    receiver.mkdir(parents=True)
    (receiver / "inductor").symlink_to(ssh_dir)
    job = tmp_path / "cache-job.json"
    job.write_text(json.dumps({"repo": "engine-cache/vllm", "commit": "0123456789abcdef", "endpoint": None,
                               "dest": str(receiver), "token_file": None, "kind": "cache", "token": TOKEN,
                               "proofs": {NAME: KEY}, "host": "gpu-02",
                               "files": {rel: {**e, "blob_id": None} for rel, e in listed.items()}}))
    proc, url = serving(holder, files=sorted(listed))
    try:
        run = subprocess.run([sys.executable, FETCH, str(job), "peer", url, f"--source-name={NAME}"],
                             capture_output=True, text=True, timeout=60)
    finally:
        proc.kill()
    assert tree_of(ssh_dir) == before  # root's keys as they were, nothing added beside them
    line = run.stderr.strip()
    assert run.returncode == 1 and len(line.splitlines()) == 1, run.stderr
    assert f"{receiver} holds what no cache may hold: inductor (a symlink to {ssh_dir})" in line
    got = tree_of(receiver)  # nothing copied in either: the link as planted, and the fetch's lock
    assert got.pop("inductor") == ("link", str(ssh_dir)) and set(got) <= {".modelfleet-lock"}, got


def relay(to_port: int, seen: list) -> int:
    """A squatter on a port: every connection forwarded to `to_port` (another server of the run), every byte
    the client sent kept in `seen`. Its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)

    def pipe(src, dst, keep):
        try:
            while data := src.recv(65536):
                if keep:
                    seen.append(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def loop():
        while True:
            client, _ = listener.accept()
            upstream = socket.create_connection(("127.0.0.1", to_port))
            threading.Thread(target=pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=pipe, args=(upstream, client, False), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    return listener.getsockname()[1]


def test_a_challenge_relayed_to_another_server_of_the_run_gets_no_token(tmp_path):
    """A squatter holds gpu-01's fan-out port and relays the receiver's nonce to gpu-02's server of the same run
    (same group, same token): before, that server's answer was the run's proof, and the token followed."""
    tree = tmp_path / "src"
    tree.mkdir()
    data = os.urandom(1 << 20)
    (tree / "model.safetensors").write_bytes(data)
    other, other_url = serving(tree, name="gpu-02", key="2b" * 32)  # the honest server the squatter relays to
    seen: list[bytes] = []
    squatted = relay(int(other_url.rsplit(":", 1)[1].strip("/")), seen)
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"repo": "org/m", "commit": "c" * 40, "endpoint": "", "dest": str(tmp_path / "dst"),
                               "token_file": None, "token": TOKEN, "proofs": {NAME: KEY}, "files": {
                                   "model.safetensors": {"size": len(data), "blob_id": None,
                                                         "sha256": hashlib.sha256(data).hexdigest()}}}))
    try:
        run = subprocess.run([sys.executable, FETCH, str(job), "peer", f"http://127.0.0.1:{squatted}/",
                              f"--source-name={NAME}"], capture_output=True, text=True, timeout=60)
    finally:
        other.kill()
    relayed = b"".join(seen)
    assert CHALLENGE.encode() in relayed  # the nonce did cross
    assert TOKEN.encode() not in relayed and b"Authorization" not in relayed  # the token did not
    assert run.returncode == 1 and "did not prove it is this run's fan-out server" in run.stderr, run.stderr
    assert f"not {NAME}'s proof" in run.stderr
    assert not (tmp_path / "dst" / "model.safetensors").exists()


def lying_peer(size: int, name: str, announce: int | None) -> tuple[ThreadingHTTPServer, list]:
    """A peer of the run gone bad (it holds its proof key: it proves itself), that streams `size` bytes for
    any file, announcing `announce` bytes (None: no length, then it closes). Its server and the bytes sent."""
    sent = [0]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if urllib.parse.urlsplit(self.path).path == CHALLENGE:
                where = f"127.0.0.1:{self.server.server_address[1]}"
                body = proof(KEY, self.headers["X-Modelfleet-Nonce"], name, where).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(200)
            if announce is not None:
                self.send_header("Content-Length", str(announce))
            self.end_headers()
            block = b"A" * (256 << 10)
            try:
                while sent[0] < size:
                    self.wfile.write(block)
                    sent[0] += len(block)
                    time.sleep(0.002)
            except OSError:
                pass

        def log_message(self, *_):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, sent


def largest_file(directory) -> int:
    """The largest file the copy wrote below `directory` (the fetch's lock, its pid and start time, aside)."""
    biggest = 0
    for top, _, names in os.walk(directory):
        for name in set(names) - {".modelfleet-lock"}:
            try:
                biggest = max(biggest, os.lstat(os.path.join(top, name)).st_size)
            except OSError:
                pass
    return biggest


@pytest.mark.parametrize(("proven", "announce"), [(False, None), (False, 194_000_000), (True, None)])
def test_a_source_streaming_more_than_a_file_holds_gets_no_more_than_its_size_written(tmp_path, proven, announce):
    """A source streams 64 MiB (announced as 194 MB, or not at all) for a 4-byte file: a mirror, or a peer of
    the run gone bad (it proves itself). Before, all of it was written, as root, and the message blamed a
    checksum."""
    server, sent = lying_peer(64 << 20, "gpu-03", announce)
    dest = tmp_path / "dst"
    job = tmp_path / "job.json"
    peer = {"token": TOKEN, "proofs": {"gpu-03": KEY}} if proven else {}  # a mirror is asked without a token
    job.write_text(json.dumps({"repo": "org/m", "commit": "c" * 40, "endpoint": "", "dest": str(dest),
                               "token_file": None, **peer, "files": {
                                   "config.json": {"size": 4, "blob_id": None,
                                                   "sha256": hashlib.sha256(b"{}\n\n").hexdigest()}}}))
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    proc = subprocess.Popen([sys.executable, FETCH, str(job), "peer", url, "--source-name=gpu-03"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    written = 0
    while proc.poll() is None:  # what the attacker got onto the disk, watched while it streams
        written = max(written, largest_file(dest))
        time.sleep(0.001)
    out, err = proc.communicate()
    server.shutdown()
    assert written <= 4, f"{written} bytes written for a 4-byte file"
    line = err.strip()
    assert proc.returncode == 1 and len(line.splitlines()) == 1, err
    assert f"the source gpu-03 ({url}) sent more than the 4 bytes of config.json" in line
    assert "partial file was removed" in line
    assert largest_file(dest) == 0 and not [n for n in os.listdir(dest) if "partial" in n]


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


@pytest.mark.slow  # waits out a timeout
def test_3000_idle_connections_neither_starve_nor_pin_the_server(tmp_path):
    """3,000 connections that never send a request: before, each held a thread for good (3,002 threads) and
    kept the server's idle timer from firing. Challenges (which anyone may ask) renew nothing either."""
    tree = tmp_path / "src"
    tree.mkdir()
    data = os.urandom(1 << 20)
    (tree / "model.safetensors").write_bytes(data)
    proc, url = serving(tree, idle_s=8)
    port = int(url.rsplit(":", 1)[1].strip("/"))
    idle = []
    try:
        for _ in range(3000):
            s = socket.socket()
            s.connect(("127.0.0.1", port))
            idle.append(s)
        time.sleep(1.5)
        threads = threads_of(proc.pid)
        assert threads <= 200, f"{threads} threads for 3,000 idle connections"
        # An honest receiver (another address) is served meanwhile, every byte.
        with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=("127.0.0.2", 0)) as conn:
            conn.sendall(f"GET /model.safetensors HTTP/1.0\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
            got = b""
            while chunk := conn.recv(1 << 20):
                got += chunk
        assert got.split(b"\r\n", 1)[0].endswith(b"200 OK") and got.endswith(data)
        served = time.monotonic()
        # The idle connections stay open and an attacker keeps asking challenges: the server still ends.
        while proc.poll() is None and time.monotonic() - served < 20:
            with socket.create_connection(("127.0.0.1", port), timeout=5,
                                          source_address=("127.0.0.3", 0)) as conn:
                conn.sendall(f"GET {CHALLENGE} HTTP/1.0\r\nX-Modelfleet-Nonce: {'ab' * 16}\r\n\r\n".encode())
                conn.recv(4096)
            time.sleep(0.5)
        assert proc.poll() == 0, "the server outlived its idle time"
        assert time.monotonic() - served < 8 + 5
    finally:
        proc.kill()
        for s in idle:
            s.close()
