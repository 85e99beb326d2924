"""The fetch script's peer server and client on this machine (loopback): a copy verifies against the hub's
sha256, and a send cap holds the server to its rate; the server gives nothing but its job's files, to a holder
of the run's token, and a receiver sends its token only to a listener that proves it is the run's server."""

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from modelfleet import FILES_DIR
from tests.helpers.fetch_peer import FETCH, KEY, NAME, TOKEN, free_port, serving
from tests.helpers.listener import scripted_http

SIZE = 16 << 20


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


def with_token(job, token=TOKEN, proofs=None):
    """A receiver's job as the control node writes it: the run's token and its sources' proof keys."""
    data = json.loads(job.read_text())
    job.write_text(json.dumps({**data, "token": token, "proofs": proofs or {NAME: KEY, "gpu-03": KEY}}))
    return job


@pytest.mark.parametrize("rate_mb_s", [None, 40])
def test_a_peer_copy_verifies_and_a_capped_server_keeps_to_its_rate(source, rate_mb_s):
    tmp_path, job = source
    proc, url = serving(tmp_path / "src", *([str(rate_mb_s)] if rate_mb_s else []))
    try:
        start = time.monotonic()
        run = subprocess.run([sys.executable, FETCH, str(with_token(job)), "peer", url, f"--source-name={NAME}"],
                             capture_output=True, text=True)
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


def cache_job(tmp_path, dest, files):
    """A cache receiver's job as the control node writes it: the holder's index as the files, the token."""
    job = tmp_path / "cache-job.json"
    job.write_text(json.dumps({"repo": "engine-cache/vllm", "commit": "0123456789abcdef", "endpoint": None,
                               "dest": str(dest), "token_file": None, "kind": "cache", "token": TOKEN,
                               "proofs": {NAME: KEY},
                               "files": {rel: {**e, "blob_id": None} for rel, e in files.items()}}))
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
    report = json.loads(indexed.stdout)
    assert report["files"] == 2
    listed = json.loads((seed / ".modelfleet-manifest.json").read_text())["files"]
    assert report["manifest"] == listed  # the control node reads the index from the command's output
    assert sorted(listed) == ["triton/kernel.cubin", "vllm/torch_compile_cache/ab12/rank_0_0/model.bin"]
    assert listed["triton/kernel.cubin"]["sha256"] == hashlib.sha256(b"cubin" * 1000).hexdigest()
    proc, url = serving(seed, files=sorted(listed))
    try:
        dest = tmp_path / "peer" / "0123456789abcdef"
        run = subprocess.run([sys.executable, FETCH, str(cache_job(tmp_path, dest, listed)), "peer", url,
                              f"--source-name={NAME}"], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        for rel in listed:
            assert (dest / rel).read_bytes() == (seed / rel).read_bytes()
        assert sorted(json.loads((dest / ".modelfleet-manifest.json").read_text())["files"]) == sorted(listed)
        assert not (dest / ".modelfleet-cache-key.json").exists()  # each host writes its own
        assert not (tmp_path / "cache-job.json").exists()  # the job with the token is gone once read
        # The engine rewrote a file after the index: the copy no longer matches the index, and is refused.
        (seed / "triton" / "kernel.cubin").write_bytes(b"CUBIN" * 1000)
        other = tmp_path / "peer2" / "0123456789abcdef"
        run = subprocess.run([sys.executable, FETCH, str(cache_job(tmp_path, other, listed)), "peer", url,
                              f"--source-name={NAME}"], capture_output=True, text=True)
        line = run.stderr.strip()
        assert run.returncode == 1 and len(line.splitlines()) == 1, run.stderr
        assert "engine cache 0123456789abcdef" in line and f"sent by peer {NAME}" in line
        assert "triton/kernel.cubin" in line and "removed" in line and "hub" not in line and "current" not in line
        assert not (other / "triton" / "kernel.cubin").exists() and not (other / ".modelfleet-manifest.json").exists()
    finally:
        proc.kill()


def get(url: str, path: str, token: str | None = TOKEN) -> tuple[int, bytes]:
    """What an attacker on the pool network gets for `path`: the status and every byte of the body."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1].strip("/")))) as conn:
        lines = [f"GET {path} HTTP/1.0", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
        conn.sendall("\r\n".join(lines).encode())
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_the_server_gives_only_its_jobs_files_to_a_holder_of_the_token(tmp_path):
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "served.bin").write_bytes(b"S" * 1000)
    (tree / "unlisted.bin").write_bytes(b"U" * 1000)
    secret = tmp_path / "secret.env"
    secret.write_text("API_KEY=do-not-leak\n")
    (tree / "innocent.json").symlink_to(secret)
    (tree / "rootfs").symlink_to("/")
    (tree / "linkdir").symlink_to(tree / "sub")
    listed = ["sub/served.bin", "innocent.json", "rootfs/etc/passwd", "linkdir/served.bin", "../secret.env"]
    proc, url = serving(tree, files=listed)
    try:
        assert get(url, "/sub/served.bin") == (200, b"S" * 1000)
        got = {path: get(url, path, token) for path, token in [
            ("/sub/served.bin", None), ("/sub/served.bin", "0" * 64), ("/sub/served.bin", TOKEN[:-1]),
            ("/unlisted.bin", TOKEN), ("/", TOKEN), ("/sub/", TOKEN), ("/innocent.json", TOKEN),
            ("/rootfs/etc/passwd", TOKEN), ("/linkdir/served.bin", TOKEN), ("/../secret.env", TOKEN),
            ("/%2e%2e/secret.env", TOKEN), ("/.modelfleet-challenge", TOKEN)]}
        assert all(body == b"" for _, body in got.values()), got  # not one byte of anything
        assert got["/sub/served.bin"][0] == 401  # no token, a wrong one, or a cut one
        assert {got[p][0] for p in ("/innocent.json", "/rootfs/etc/passwd", "/linkdir/served.bin")} == {403}
        assert {got[p][0] for p in ("/unlisted.bin", "/", "/sub/")} == {404}
    finally:
        proc.kill()


def test_a_receiver_sends_its_token_only_to_a_listener_that_proves_it_is_the_runs_server(source):
    """A squatter on the port answers anything with 200: the receiver asks it one nonce, gets no proof, and
    neither sends the token nor keeps a byte."""
    tmp_path, job = source
    seen = []
    url = scripted_http(b"HTTP/1.0 200 OK\r\nContent-Length: 4\r\n\r\nevil", seen)
    run = subprocess.run([sys.executable, FETCH, str(with_token(job)), "peer", url, "--source-name=gpu-03"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "did not prove it is this run's fan-out server" in run.stderr, run.stderr
    assert len(seen) == 1 and b"/.modelfleet-challenge" in seen[0]
    assert TOKEN.encode() not in b"".join(seen) and b"Authorization" not in b"".join(seen)
    assert not any((tmp_path / "dst").rglob("model.safetensors"))


def test_the_probe_names_the_process_holding_the_port(tmp_path):
    port = free_port()
    squatter = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                                cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            time.sleep(0.05)
        job = tmp_path / "serve.json"
        job.write_text(json.dumps({"dir": str(tmp_path), "address": "127.0.0.1", "port": port, "token": TOKEN,
                                   "files": [], "name": "gpu-05", "proof_key": KEY}))
        proc, _ = subprocess.Popen([sys.executable, FETCH, "serve"], stdin=subprocess.PIPE,
                                   stderr=subprocess.PIPE), None
        proc.stdin.write(job.read_bytes())
        proc.stdin.close()
        assert proc.wait(10) != 0 and b"Address already in use" in proc.stderr.read()  # the real one cannot bind
        probe = subprocess.run([sys.executable, FETCH, "probe", str(job), "gpu-05"], capture_output=True, text=True,
                               timeout=60)
        line = probe.stderr.strip()
        assert probe.returncode == 1 and len(line.splitlines()) == 1, probe.stderr
        assert f"host gpu-05: fan-out port 127.0.0.1:{port} is held by" in line and "not by this run's server" in line
        if shutil.which("ss"):
            assert f"pid {squatter.pid}" in line
    finally:
        squatter.kill()


def test_an_index_makes_an_engines_private_cache_files_readable_to_the_unprivileged_peer_server(tmp_path):
    """vLLM 0.32.0 wrote its modelinfos 0600 (mkstemp) and the peer server, a DynamicUser, answered 403."""
    seed = tmp_path / "seed" / "0123456789abcdef"
    private = seed / "vllm" / "modelinfos"
    private.mkdir(parents=True)
    (seed / "vllm").chmod(0o700)
    private.chmod(0o700)
    info = private / "vllm-model_executor-models-llama-LlamaForCausalLM.json"
    info.write_text("{}")
    info.chmod(0o600)
    (seed / ".modelfleet-cache-key.json").write_text("{}")
    (seed / ".modelfleet-cache-key.json").chmod(0o600)
    outside = tmp_path / "secret"  # a file of the host's, hard-linked into the cache: never opened to all
    outside.write_text("s")
    outside.chmod(0o600)
    os.link(outside, seed / "vllm" / "linked")
    indexed = subprocess.run([sys.executable, FETCH, "index", str(seed), "engine-cache/vllm"],
                             capture_output=True, text=True)
    assert indexed.returncode == 0, indexed.stderr
    assert oct(info.stat().st_mode & 0o777) == "0o644"
    assert [oct(d.stat().st_mode & 0o777) for d in (seed / "vllm", private)] == ["0o755", "0o755"]
    assert oct((seed / ".modelfleet-cache-key.json").stat().st_mode & 0o777) == "0o600"  # not a file it gives
    assert oct(outside.stat().st_mode & 0o777) == "0o600"
    if os.geteuid() == 0:  # what the server's user gets: the file, read as nobody from the tree (as it serves)
        read = subprocess.run(["runuser", "-u", "nobody", "--", "cat", str(info.relative_to(seed))], cwd=seed,
                              capture_output=True, text=True)
        assert read.returncode == 0 and read.stdout == "{}", read.stderr


@pytest.mark.parametrize("plant", ["symlink", "fifo", "setuid"])
def test_an_index_refuses_what_no_cache_may_hold_and_names_it(tmp_path, plant):
    cache = tmp_path / "0123456789abcdef"
    (cache / "triton").mkdir(parents=True)
    (cache / "triton" / "kernel.cubin").write_bytes(b"k")
    bad = cache / "triton" / "launcher.so"
    if plant == "symlink":
        bad.symlink_to("/etc/shadow")
    elif plant == "fifo":
        os.mkfifo(bad)
    else:
        bad.write_bytes(b"x")
        bad.chmod(0o4755)
    run = subprocess.run([sys.executable, FETCH, "index", str(cache), "engine-cache/vllm"], capture_output=True,
                         text=True, timeout=60)
    line = run.stderr.strip()
    assert run.returncode == 1 and len(line.splitlines()) == 1 and "triton/launcher.so" in line, run.stderr
    assert not (cache / ".modelfleet-manifest.json").exists()


def test_the_script_names_the_checkpoint_layout_as_the_package_does():
    # It runs alone on hosts (nothing of the package there), so it keeps its own copy of these names.
    from modelfleet.base import host_commands
    text = (FILES_DIR / "modelfleet_fetch.py").read_text()
    assert f'MANIFEST = "{host_commands.MANIFEST}"' in text
    assert f'"{host_commands.FETCH_LOCK}"' in text and f'PARTIAL = "{host_commands.PARTIAL}"' in text


def test_a_hub_name_that_stops_resolving_is_named_as_such():
    """What huggingface_hub raises when the resolver fails mid-run (its error wraps httpx's, which wraps the
    resolver's): one line naming the host and the name, not a failed download."""
    import httpx2

    from modelfleet.files.modelfleet_fetch import source_failed

    job = {"host": "gpu-4", "endpoint": "https://hub.example.internal:8443"}
    try:
        try:
            try:
                raise socket.gaierror(-3, "Temporary failure in name resolution")
            except socket.gaierror as error:
                raise httpx2.ConnectError(str(error)) from error
        except httpx2.ConnectError as error:
            raise RuntimeError("An error happened while trying to locate the file on the Hub") from error
    except RuntimeError as error:
        said = str(source_failed(job, error))
    assert said.startswith("host gpu-4: the hub's name hub.example.internal does not resolve there"), said
    assert "resolv.conf" in said


def mirror(refusals: int, data: bytes, status: int = 503, retry_after: str | None = "1") -> tuple[str, list]:
    """A plain HTTP mirror that answers `status` (with Retry-After) to its first `refusals` requests, then serves
    `data`. Its URL and the times of the requests it got."""
    import http.server
    import threading

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            seen.append(time.monotonic())
            if len(seen) <= refusals:
                self.send_response(status)
                if retry_after is not None:
                    self.send_header("Retry-After", retry_after)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/", seen


@pytest.mark.slow  # waits out a timeout
def test_a_mirror_asking_to_retry_is_obeyed_within_the_deadline_and_named_beyond_it(source):
    tmp_path, job = source
    data = (tmp_path / "src" / "model.safetensors").read_bytes()
    job.write_text(json.dumps({**json.loads(job.read_text()), "host": "gpu-2", "stall_s": 4}))
    url, seen = mirror(2, data)
    run = subprocess.run([sys.executable, FETCH, str(job), "peer", url], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert len(seen) == 3 and seen[1] - seen[0] >= 1 and seen[2] - seen[1] >= 1  # where it asked, no sooner
    shutil.rmtree(tmp_path / "dst")
    url, seen = mirror(100, data, status=429, retry_after="30")
    run = subprocess.run([sys.executable, FETCH, str(job), "peer", url], capture_output=True, text=True, timeout=60)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 1 and len(lines) == 1 and len(seen) == 1, run.stderr
    assert lines[0].startswith(f"modelfleet: host gpu-2: the mirror ({url}) answered HTTP 429, asking to retry "
                               "after 30 s (for model.safetensors), beyond the run's deadline"), lines[0]
    assert not [p for p in (tmp_path / "dst").rglob("*") if p.is_file() and "modelfleet-lock" not in p.name]
