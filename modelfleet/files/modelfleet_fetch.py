#!/usr/bin/env python3
"""Put one checkpoint revision on this host, complete and verified (run by modelfleet's model stage).

    modelfleet_fetch.py JOB.json hub            download from the hub (huggingface_hub, in the stage's venv)
    modelfleet_fetch.py JOB.json peer URL       copy from a pool peer that already holds verified files (HTTP)
    ... [--source-name=HOST]                    the peer's name, for the messages
    modelfleet_fetch.py JOB.json verify         verify only
    ... [--reverify]                            hash every file, even those the manifest vouches for
    modelfleet_fetch.py serve DIR ADDRESS PORT [MB_S]
                                                serve a verified copy to peers (read-only, sendfile),
                                                at most MB_S megabytes per second in all
    modelfleet_fetch.py index DIR NAME          write DIR's manifest from what is there (an engine cache the
                                                engine filled): every file's size, mtime and sha256

A job whose `files` is null (an engine cache) takes them from the peer's manifest (URL/.modelfleet-manifest.json),
so every file is still checked against a sha256 and a torn copy is never kept.

JOB.json (written by the control node): repo, commit, endpoint, dest, token_file, and the hub's metadata for
every file: {path: {size, sha256 (LFS files) | null, blob_id (git's blob sha1) | null}}. A file counts as
verified when its size matches and its sha256 (LFS files) or git blob id (the others: config, tokenizer)
matches the hub's — or, on a re-run, when size and mtime equal what the manifest recorded after a full check.
Missing or corrupt files are (re)fetched; completed files are never fetched again. The result goes to
DEST/.modelfleet-manifest.json and, as JSON, to stdout. The token is read from its 0600 file, never argv.

One fetch per destination at a time (an flock on DEST/.modelfleet-lock, held until the manifest is written),
and partial files are named per process, so two runs can never interleave bytes; the manifest records only
digests of the bytes now on disk. Any failure ends in one line on stderr (`modelfleet: ...`, exit 1) saying
what failed and what to do; the traceback goes to JOB.json's `.log` beside it.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import http.client
import json
import os
import socket
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MANIFEST = ".modelfleet-manifest.json"
CHUNK = 4 << 20
RECV = 256 << 10  # a receive block the hash reads back from the CPU's cache: half the CPU per byte of 4 MiB
WORKERS = 8


class FetchError(Exception):
    """A failure with its one-line explanation for the operator."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def git_blob_id(path: Path) -> str:
    """git's object id of the file: sha1 over `blob <size>\\0` and the bytes (the hub's blob_id)."""
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with path.open("rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def check(dest: Path, files: dict, manifest: dict, reverify: bool,
          streamed: dict | None = None) -> tuple[dict, list[str]]:
    """
    (verified entries for the manifest, paths that must be fetched). Hashes run in parallel across files;
    `streamed` holds digests already computed while the bytes arrived.
    """

    def one(item):
        rel, meta = item
        path = dest / rel
        if not path.is_file() or path.stat().st_size != meta["size"]:
            return rel, None
        st = path.stat()
        known = manifest.get(rel)
        if not reverify and known and known["size"] == st.st_size and known["mtime"] == st.st_mtime:
            return rel, known
        if meta.get("sha256") or reverify and not meta.get("blob_id"):
            digest = (streamed or {}).get(rel) or sha256_of(path)
            if meta.get("sha256") and digest != meta["sha256"]:
                return rel, None
            return rel, {"size": st.st_size, "mtime": st.st_mtime, "sha256": digest}
        if meta.get("blob_id"):
            if git_blob_id(path) != meta["blob_id"]:
                return rel, None
            return rel, {"size": st.st_size, "mtime": st.st_mtime, "blob_id": meta["blob_id"]}
        return rel, {"size": st.st_size, "mtime": st.st_mtime}  # the source gave no checksum: size only

    with ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(one, files.items()))
    return {rel: entry for rel, entry in results if entry}, [rel for rel, entry in results if not entry]


def fetch_from_hub(job: dict, paths: list[str]) -> None:
    from huggingface_hub import snapshot_download

    token_file = job.get("token_file")
    token = Path(token_file).read_text().strip() if token_file and Path(token_file).exists() else False
    for rel in paths:  # a corrupt file must go before huggingface_hub would trust it as complete
        (Path(job["dest"]) / rel).unlink(missing_ok=True)
    try:
        snapshot_download(job["repo"], revision=job["commit"], local_dir=job["dest"], endpoint=job["endpoint"],
                          token=token, allow_patterns=paths, max_workers=WORKERS)
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise
        raise FetchError(f"the hub ({job['endpoint']}) failed during the download: {one_line(error)}; "
                         "files already verified are kept, re-run when it answers") from error
    except Exception as error:  # huggingface_hub's HTTP errors carry no common base we can import here
        raise FetchError(f"the hub ({job['endpoint']}) failed during the download: {one_line(error)}; "
                         "files already verified are kept, re-run when it answers") from error


def fetch_from_peer(job: dict, paths: list[str], base_url: str, name: str | None = None) -> dict:
    """Copy each file, hashing while it streams; returns {path: sha256} so no second read is needed. `name`:
    the source host's, for the messages."""
    dest = Path(job["dest"])
    source = f"{name} ({base_url})" if name else base_url

    def one(rel):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.modelfleet-partial")  # ours alone
        digest, got, length = hashlib.sha256(), 0, None
        try:
            with urllib.request.urlopen(f"{base_url.rstrip('/')}/{rel}", timeout=60) as response, \
                    partial.open("wb") as f:
                length = response.headers.get("Content-Length")
                buffer = memoryview(bytearray(RECV))  # one buffer per stream: no allocation per block
                while n := response.readinto(buffer):
                    f.write(buffer[:n])
                    digest.update(buffer[:n])
                    got += n
        except urllib.error.URLError as error:
            partial.unlink(missing_ok=True)
            raise FetchError(f"the source {source} stopped answering ({one_line(error)}): its host failed or "
                             "its run ended; fix the source host and re-run") from error
        except (ConnectionError, TimeoutError, http.client.HTTPException) as error:
            partial.unlink(missing_ok=True)
            raise stopped(source, rel, one_line(error)) from error
        if length is not None and got != int(length):  # the server closed early: a short read, not an error
            partial.unlink(missing_ok=True)
            raise stopped(source, rel, f"{got} of {length} bytes")
        partial.replace(target)
        return rel, digest.hexdigest()

    with ThreadPoolExecutor(WORKERS) as pool:
        return dict(pool.map(one, paths))


def stopped(source: str, rel: str, how: str) -> FetchError:
    """The source went away in the middle of a file (connection reset, a short read): a dead source, not bad
    bytes."""
    return FetchError(f"source {source} stopped during the copy ({rel}: {how}): its host failed or its run "
                      "ended; files already verified are kept, fix the source host and re-run")


class Pace:
    """A send budget shared by the server's threads: each chunk waits for its slot at `rate` bytes/s."""

    def __init__(self, rate: float):
        self.rate, self.lock, self.next_free = rate, threading.Lock(), time.monotonic()

    def wait(self, size: int) -> None:
        with self.lock:
            now = time.monotonic()
            start = max(now, self.next_free)
            self.next_free = start + size / self.rate
        time.sleep(start - now)


def serve(directory: str, address: str, port: int, rate_mb_s: float | None = None) -> None:
    """Read-only HTTP for the group's peers: files go out with sendfile(2), no copy through Python, paced to
    `rate_mb_s` in all when given."""
    import functools
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    pace = Pace(rate_mb_s * 1e6) if rate_mb_s else None

    class Handler(SimpleHTTPRequestHandler):
        def copyfile(self, source, outputfile):
            if not pace:
                self.connection.sendfile(source)
                return
            offset = 0
            while True:  # socket.sendfile: os.sendfile for files, send() for a listing in memory
                pace.wait(CHUNK)
                sent = self.connection.sendfile(source, offset, CHUNK)
                if not sent:
                    return
                offset += sent

        def log_message(self, fmt, *args):
            pass

    class Server(ThreadingHTTPServer):
        # http.server's backlog of 5 drops the SYNs of a group's peers connecting at once (WORKERS streams
        # each), and each dropped one waits a second for TCP's retransmit: the fan-out stalled on it.
        request_queue_size = socket.SOMAXCONN
        daemon_threads = True

    Server((address, port), functools.partial(Handler, directory=directory)).serve_forever()


def one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def locked(dest: Path, name: str = ".modelfleet-lock", what: str = "fetch"):
    """This destination's lock (`name`), or a FetchError naming the process that holds it."""
    handle = (dest / name).open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        raise FetchError(f"another {what} into {dest} is running (pid {handle.read().strip() or '?'}); "
                         "wait for it or stop it, then re-run") from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def own_files(directory: Path) -> list[str]:
    """What an index covers: every regular file but modelfleet's own (.modelfleet-*) and partial copies."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*")
                  if p.is_file() and not p.is_symlink() and not p.name.startswith(".modelfleet-")
                  and not p.name.endswith(".modelfleet-partial"))


def index(directory: Path, name: str) -> dict:
    """DIR's manifest from its files as they are now, written whole or not at all."""
    lock = locked(directory)  # noqa: F841 (no fetch into it meanwhile)
    start = time.monotonic()
    files = {rel: {"size": (directory / rel).stat().st_size, "sha256": None} for rel in own_files(directory)}
    verified, _ = check(directory, files, {}, True)
    temp = directory / f".modelfleet-manifest.{os.getpid()}.tmp"
    temp.write_text(json.dumps({"repo": name, "commit": directory.name, "files": verified,
                                "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=1) + "\n")
    temp.replace(directory / MANIFEST)
    return {"indexed": str(directory), "files": len(verified), "bytes": sum(e["size"] for e in verified.values()),
            "seconds": round(time.monotonic() - start, 3)}


def files_from_source(base_url: str) -> dict:
    """The peer's manifest as a job's files; a path that would leave the destination is refused."""
    url = f"{base_url.rstrip('/')}/{MANIFEST}"
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            listed = json.loads(response.read())["files"]
    except (OSError, ValueError, KeyError, http.client.HTTPException) as error:
        raise FetchError(f"the source {base_url} has no readable manifest ({one_line(error)}): nothing it serves "
                         "can be checked, so nothing is copied; re-run once its cache is indexed") from error
    files = {}
    for rel, entry in listed.items():
        parts = Path(rel).parts
        if Path(rel).is_absolute() or ".." in parts or not parts or parts[-1].startswith(".modelfleet-") \
                or not isinstance(entry.get("sha256"), str) or not isinstance(entry.get("size"), int):
            raise FetchError(f"the source {base_url} lists {rel!r} without a size and sha256 or outside its "
                             "directory: refusing its copy")
        files[rel] = {"size": entry["size"], "sha256": entry["sha256"], "blob_id": None}
    return files


def main(argv: list[str]) -> int:
    if argv[0] == "serve":
        serve(argv[1], argv[2], int(argv[3]), float(argv[4]) if len(argv) > 4 else None)
        return 0
    if argv[0] == "index":
        print(json.dumps(index(Path(argv[1]), argv[2])))
        return 0
    job = json.loads(Path(argv[0]).read_text())
    mode, reverify = argv[1], "--reverify" in argv
    dest = Path(job["dest"])
    dest.mkdir(parents=True, exist_ok=True)
    lock = locked(dest)  # noqa: F841 (held until the process exits)
    manifest_path = dest / MANIFEST
    manifest = json.loads(manifest_path.read_text()).get("files", {}) if manifest_path.exists() else {}
    files = job["files"] if job["files"] is not None else files_from_source(argv[2])
    start = time.monotonic()
    verified, missing = check(dest, files, manifest, reverify)
    report = {"commit": job["commit"], "dest": str(dest), "files": len(files), "fetched": [], "bytes_fetched": 0}
    if missing and mode != "verify":
        name = next((a.split("=", 1)[1] for a in argv if a.startswith("--source-name=")), None)
        streamed = fetch_from_hub(job, missing) if mode == "hub" else fetch_from_peer(job, missing, argv[2], name)
        report["fetched"] = missing
        report["bytes_fetched"] = sum(files[rel]["size"] for rel in missing)
        again, still = check(dest, {rel: files[rel] for rel in missing}, {}, True, streamed or {})
        verified.update(again)
        missing = still
        for rel in missing:  # what failed its check goes: an engine reads its cache directory as it finds it
            (dest / rel).unlink(missing_ok=True)
    report.update(ok=not missing, missing_or_corrupt=missing, seconds=round(time.monotonic() - start, 3),
                  finished_at=round(time.time(), 3))
    if missing:
        raise FetchError(f"refused {job['repo']}@{job['commit'][:12]}: {len(missing)} file(s) do not match the "
                         f"source's size and checksum after fetching ({', '.join(missing[:5])}); `current` stays "
                         "where it was; check the source (hub or mirror) and re-run")
    manifest_path.write_text(json.dumps({"repo": job["repo"], "commit": job["commit"], "files": verified,
                                         "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                                        indent=1) + "\n")
    print(json.dumps(report))
    return 0


def run(argv: list[str]) -> int:
    """main(), with every failure as one line on stderr: what else the libraries print (progress bars,
    warnings) and the traceback go to a log beside the job (JOB.json.log)."""
    if not argv or argv[0] in ("serve", "index"):
        return main(argv)
    log = Path(f"{argv[0]}.log")
    real_stderr = sys.stderr
    try:
        sink = log.open("w")
    except OSError:
        sink = open(os.devnull, "w")
    sys.stderr = sink
    try:
        return main(argv)
    except Exception as error:
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            message = (f"disk full while writing {getattr(error, 'filename', None) or 'the checkpoint'}: free space "
                       "under model_root (or move it to a larger disk) and re-run; verified files are kept")
        elif isinstance(error, FetchError):
            message = str(error)
        else:
            message = f"fetch failed: {one_line(error)}"
        traceback.print_exc(file=sink)
        print(f"modelfleet: {message} (details: {log})", file=real_stderr)
        return 1
    finally:
        sys.stderr = real_stderr
        sink.close()


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(run(sys.argv[1:]))
