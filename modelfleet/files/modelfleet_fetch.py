#!/usr/bin/env python3
"""Put one checkpoint revision (or an engine cache) on this host, complete and verified (run by modelfleet's stages).

    modelfleet_fetch.py JOB.json hub            download from the hub (huggingface_hub, in the stage's venv)
    modelfleet_fetch.py JOB.json peer URL       copy from a pool peer that holds verified files (HTTP)
    ... [--source-name=HOST]                    the peer's name, for the messages
    modelfleet_fetch.py JOB.json swarm          copy piece by piece from the job's `peers` at once, serving the
                                                verified pieces meanwhile (modelfleet_swarm.py, beside this)
    modelfleet_fetch.py pieces DIR PIECE_SIZE   the sha256 of every piece of DIR's verified files (JSON)
    modelfleet_fetch.py JOB.json verify         verify only
    ... [--reverify]                            hash every file, even those the manifest vouches for
    modelfleet_fetch.py serve < SERVE.json      serve the files SERVE.json names to this run's peers
    modelfleet_fetch.py probe SERVE.json HOST   prove the listener on SERVE.json's port is that server
    modelfleet_fetch.py index DIR NAME          write DIR's manifest from what is there (an engine cache the
                                                engine filled): every file's size, mtime and sha256; a
                                                symlink, device, setuid file or other non-regular file in DIR
                                                is refused, named, and nothing is indexed

JOB.json (written by the control node, 0600): repo, commit, endpoint, dest, token_file, and every file's metadata
as the control node read it: {path: {size, sha256 (LFS files and caches) | null, blob_id (git's blob sha1) |
null}}. Sizes and digests never come from the source: for an engine cache, the control node read the holder's
index over SSH. A peer copy's job also holds the run's fan-out token, the proof keys of its sources only
(`proofs`: {host: key}) and says what it copies (`kind`: checkpoint or cache). No file gets more bytes than
its size: a source that sends more is cut off there, the partial file removed, the source named. A file counts
as verified when its size matches and its sha256 (LFS files) or git blob id (the others: config, tokenizer)
matches — or, on a re-run, when size and mtime equal what the manifest recorded after a full check. Missing or
corrupt files are (re)fetched; completed files are never fetched again. The result goes to
DEST/.modelfleet-manifest.json and, as JSON, to stdout. Tokens are read from 0600 files, never argv.

The peer server (`serve`, started by the stage as an unprivileged transient unit, its job on stdin) answers
GET of exactly the names its job lists, each opened below its directory without following a symlink, to a
request carrying the run's token (`Authorization: Bearer`); no listing, nothing else. Before a token is sent,
the listener proves it is that host's server of the run: it answers a nonce with HMAC-SHA256 under its host's
proof key (made per run and host by the control node) over its host name, the address and port it listens on
and the nonce, so an answer relayed from another server of the run is no proof. A connection that has not
shown the token gets HEADER_S for its request and holds no lease; at most MAX_CONNECTIONS are open, and
UNPROVEN_PER_PEER without the token from one address (those beyond are closed at once). It also answers
`/.modelfleet-have` (which files, or which pieces of them, it holds verified) and a Range request of exactly one
piece it holds; a receiver's server (`swarm` in its job) holds only what its fetch wrote in .modelfleet-have.json.

One fetch per destination at a time (an flock on DEST/.modelfleet-lock, held until the manifest is written),
and partial files are named per process, so two runs can never interleave bytes; the manifest records only
digests of the bytes now on disk. An engine cache's directory is written by its engine's container too, so
every command works in DEST (and DIR) by descriptor (Tree): opened once without following a link, each name
below reached component by component with O_NOFOLLOW, new files O_EXCL under unguessable names renamed into
place, the lock opened O_NOFOLLOW and refused unless a plain file; a cache directory holding a symlink, device,
pipe, socket or setuid file is refused and named, on a receiver as on a holder. Any failure ends in one line
on stderr (`modelfleet: ...`, exit 1) saying what failed and what to do; the traceback goes to JOB.json's
`.log` beside it.

Why one file of over 400 lines: it runs on hosts with python3's standard library alone (the hub download in the
stage's venv), copied beside modelfleet_swarm.py (the piece exchange); its commands share the job format, the
verification and the lock, which a split would have to ship and version together anyway.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import hmac
import http.client
import json
import os
import re
import secrets
import select
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MANIFEST = ".modelfleet-manifest.json"
CHALLENGE = "/.modelfleet-challenge"
CHUNK = 4 << 20
RECV = 256 << 10  # a receive block the hash reads back from the CPU's cache: half the CPU per byte of 4 MiB
WORKERS = 8
# The peer server's bounds: a request line and headers within HEADER_S; at most MAX_CONNECTIONS open (a thread
# each) and UNPROVEN_PER_PEER from one address before it shows the token (a lab's hosts all connect from
# 127.0.0.1: a 12-host star opens 88 at once).
HEADER_S = 10
MAX_CONNECTIONS = 512
UNPROVEN_PER_PEER = 128


class FetchError(Exception):
    """A failure with its one-line explanation for the operator."""


DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
PARTIAL = ".modelfleet-partial"


class Tree:
    """A directory root works in, which a container may write too (an engine cache is mounted read-write in its
    engine's container): opened once without following a symlink, and every name below it reached from that
    descriptor one component at a time, none followed. New files are made O_EXCL under names no one can guess and
    renamed into place (a rename replaces a planted link, never writes through it). Whatever was planted, nothing
    root does here lands outside the directory."""

    def __init__(self, path):
        self.path = Path(path)
        try:
            self.fd = os.open(self.path, DIR_FLAGS)
        except OSError as error:
            if error.errno in (errno.ELOOP, errno.ENOTDIR):
                raise FetchError(f"{self.path} is a symlink or not a directory: refusing to work in it; find out "
                                 "who made it, remove it and re-run") from None
            raise
        self.temps: set[str] = set()  # this process's files not yet renamed: removed when it must stop

    def parent(self, rel: str, create: bool = False) -> tuple[int, str]:
        """(a descriptor of `rel`'s directory, `rel`'s last name), each directory opened without following a
        symlink (made, 0755, with `create`); the caller closes the descriptor."""
        parts = rel.split("/")
        if any(part in ("", ".", "..") for part in parts):
            raise FetchError(f"{self.path}: refusing the path {rel!r}: it leaves the directory")
        fd = os.dup(self.fd)
        try:
            for part in parts[:-1]:
                try:
                    inner = os.open(part, DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=fd)
                    inner = os.open(part, DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = inner
        except BaseException:
            os.close(fd)
            raise
        return fd, parts[-1]

    def lstat(self, rel: str) -> os.stat_result | None:
        """`rel`'s own status (a link's, not its target's), or None when it or a directory above is missing or
        is not a plain directory."""
        try:
            fd, name = self.parent(rel)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as error:
            if error.errno == errno.ELOOP:
                return None
            raise
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        finally:
            os.close(fd)

    def size(self, rel: str) -> int | None:
        """The size of `rel` when it is a regular file, else None."""
        st = self.lstat(rel)
        return st.st_size if st and stat.S_ISREG(st.st_mode) else None

    def open(self, rel: str) -> int:
        """A read descriptor of the regular file `rel` (no link followed, no device, no setuid file)."""
        return open_beneath(self.fd, rel)

    def read(self, rel: str) -> bytes | None:
        try:
            with os.fdopen(self.open(rel), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def create(self, rel: str) -> tuple[int, str]:
        """A new file beside `rel` (its directories made as needed) under a name no one can guess, made here and
        by this process alone (O_EXCL): (a read-write descriptor, its path below the tree)."""
        fd, name = self.parent(rel, create=True)
        temp = f".{name}.{os.getpid()}.{secrets.token_hex(8)}{PARTIAL}"
        try:
            new = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd)
        finally:
            os.close(fd)
        temp_rel = "/".join(rel.split("/")[:-1] + [temp])
        self.temps.add(temp_rel)
        return new, temp_rel

    def rename(self, temp_rel: str, rel: str) -> None:
        """Give a file this process made (`create`) its name: a link planted under that name is replaced."""
        src, src_name = self.parent(temp_rel)
        try:
            dst, dst_name = self.parent(rel)
            try:
                os.rename(src_name, dst_name, src_dir_fd=src, dst_dir_fd=dst)
            finally:
                os.close(dst)
        finally:
            os.close(src)
        self.temps.discard(temp_rel)

    def unlink(self, rel: str) -> None:
        """Remove `rel` (a link itself, never its target); nothing when it is not there."""
        self.temps.discard(rel)
        try:
            fd, name = self.parent(rel)
        except (FileNotFoundError, NotADirectoryError):
            return
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)

    def write(self, rel: str, data: bytes, mode: int = 0o644) -> None:
        """`rel` replaced whole by `data` (a new file renamed over it)."""
        fd, temp = self.create(rel)
        try:
            os.fchmod(fd, mode)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            self.rename(temp, rel)
        except BaseException:
            self.unlink(temp)
            raise

    def drop_temps(self) -> None:
        for rel in list(self.temps):
            with contextlib.suppress(OSError):
                self.unlink(rel)

    def entries(self) -> list[tuple[str, os.stat_result, str]]:
        """Every entry below the tree: (path, its own status, a link's target or ""), walking plain directories
        only (os.fwalk: by descriptor, no link followed)."""
        out = []
        for top, dirs, names, dir_fd in os.fwalk(".", dir_fd=self.fd):
            for name in sorted(dirs + names):
                rel = os.path.normpath(os.path.join(top, name))
                with contextlib.suppress(FileNotFoundError):
                    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    what = os.readlink(name, dir_fd=dir_fd) if stat.S_ISLNK(st.st_mode) else ""
                    out.append((rel, st, what))
        return out

    def odd(self) -> list[str]:
        """What no cache may hold, each named: a symlink, a device, a pipe or socket, a setuid or setgid file."""
        refused = []
        for rel, st, target in self.entries():
            mode = st.st_mode
            if stat.S_ISLNK(mode):
                refused.append(f"{rel} (a symlink to {target})")
            elif stat.S_ISDIR(mode):
                continue
            elif not stat.S_ISREG(mode):
                refused.append(f"{rel} (not a regular file)")
            elif mode & (stat.S_ISUID | stat.S_ISGID):
                refused.append(f"{rel} (setuid or setgid)")
        return refused


def as_tree(where) -> Tree:
    """A Tree as it is, or one of a path given by a caller that owns it (`modelfleet mirror`, on the control node:
    no container writes there, and its directory may be a link the operator made)."""
    return where if isinstance(where, Tree) else Tree(Path(where).resolve())


class Oversized(Exception):
    """A source sent (or announced) more bytes than the control node read for the file."""


class Watchdog(threading.Thread):
    """Ends the fetch in one line when, armed, no byte arrived for `stall_s` (a frozen source: the bytes the
    peer streams count, or for the hub the growth of the destination's files), and ends it quietly when the run
    that started it is gone (its SSH session closed the other end of stdout): no fetch outlives its run."""

    def __init__(self, job: dict, tree: Tree):
        super().__init__(daemon=True)
        self.stall_s, self.tree, self.host = float(job.get("stall_s") or 60), tree, job.get("host") or "this host"
        self.dest = tree.path
        self.armed, self.last, self.seen, self.source, self.waiting = False, time.monotonic(), -1, "", lambda: []
        self.moved_bytes = 0

    def arm(self, source: str, waiting) -> None:
        """Watch for progress from `source`; `waiting()` names the files not yet complete."""
        self.source, self.waiting, self.last, self.armed = source, waiting, time.monotonic(), True

    def moved(self, n: int) -> None:
        self.moved_bytes += n

    def progress(self) -> int:
        if self.moved_bytes:
            return self.moved_bytes
        total = 0
        for path in self.dest.rglob("*"):
            with contextlib.suppress(OSError):
                total += path.stat().st_size if path.is_file() else 0
        return total

    def run(self) -> None:
        while True:
            time.sleep(1)
            if orphaned():
                give_up(self.tree)
                os._exit(3)
            if not self.armed:
                continue
            now, size = time.monotonic(), self.progress()
            if size != self.seen:
                self.seen, self.last = size, now
            elif now - self.last > self.stall_s:
                names = self.waiting()
                shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
                source = self.source() if callable(self.source) else self.source
                asked = ANSWERS.get("last")
                if asked and now - asked["at"] < self.stall_s:  # it answered, refusing: not a frozen source
                    say(f"host {self.host}: {source} {answered(asked)} for {self.stall_s:g} s while fetching "
                        f"{shown or 'the checkpoint'} (model_stall_s): files already verified are kept, the other "
                        "hosts go on; re-run when it serves again")
                else:
                    say(f"host {self.host}: no byte from {source} for {self.stall_s:g} s while fetching "
                        f"{shown or 'the checkpoint'} (model_stall_s): the source froze; files already verified "
                        "are kept, the other hosts go on; re-run when it answers")
                give_up(self.tree)
                os._exit(1)


def orphaned() -> bool:
    """Has the reader of our stdout (sshd, for a run's command) gone? A pipe's writer sees POLLERR, a socket's
    POLLHUP. Never for a terminal or a file."""
    try:
        mode = os.fstat(1).st_mode
    except OSError:
        return False
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return False
    poller = select.poll()
    poller.register(1, 0)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


REAL_STDERR = sys.stderr
LOG = ""


def say(message: str) -> None:
    """One line for the operator, on the stderr the command was given (the libraries' goes to the log)."""
    print(f"modelfleet: {message}" + (f" (details: {LOG})" if LOG else ""), file=REAL_STDERR, flush=True)


def _digest(fd: int, digest):
    with os.fdopen(fd, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_of(path: Path, tree: Tree | None = None) -> str:
    """The sha256 of `path` (below `tree`, read without following a link, when given)."""
    return _digest(tree.open(str(path)) if tree else os.open(path, os.O_RDONLY | os.O_CLOEXEC), hashlib.sha256())


def git_blob_id(path: Path, tree: Tree | None = None) -> str:
    """git's object id of the file: sha1 over `blob <size>\\0` and the bytes (the hub's blob_id)."""
    fd = tree.open(str(path)) if tree else os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    return _digest(fd, hashlib.sha1(f"blob {os.fstat(fd).st_size}\0".encode()))


def check(dest, files: dict, manifest: dict, reverify: bool,
          streamed: dict | None = None, bad: dict | None = None) -> tuple[dict, list[str]]:
    """
    (verified entries for the manifest, paths that must be fetched). Hashes run in parallel across files;
    `streamed` holds digests already computed while the bytes arrived; `bad` gets, for each present file of
    the right size whose digest is wrong, {path: (expected, found)}. Only regular files count (a link is
    missing); `dest`: a Tree or a path.
    """
    tree = as_tree(dest)

    def one(item):
        rel, meta = item
        st = tree.lstat(rel)
        if st is None or not stat.S_ISREG(st.st_mode) or st.st_size != meta["size"]:
            return rel, None
        known = manifest.get(rel)
        if not reverify and known and known["size"] == st.st_size and known["mtime"] == st.st_mtime:
            return rel, known
        if meta.get("sha256") or reverify and not meta.get("blob_id"):
            digest = (streamed or {}).get(rel) or sha256_of(rel, tree)
            if meta.get("sha256") and digest != meta["sha256"]:
                if bad is not None:
                    bad[rel] = (f"sha256 {meta['sha256']}", f"sha256 {digest}")
                return rel, None
            return rel, {"size": st.st_size, "mtime": st.st_mtime, "sha256": digest}
        if meta.get("blob_id"):
            found = git_blob_id(rel, tree)
            if found != meta["blob_id"]:
                if bad is not None:
                    bad[rel] = (f"git blob {meta['blob_id']}", f"git blob {found}")
                return rel, None
            return rel, {"size": st.st_size, "mtime": st.st_mtime, "blob_id": meta["blob_id"]}
        return rel, {"size": st.st_size, "mtime": st.st_mtime}  # the source gave no checksum: size only

    with ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(one, files.items()))
    return {rel: entry for rel, entry in results if entry}, [rel for rel, entry in results if not entry]


def fetch_from_hub(job: dict, paths: list[str], tree: Tree) -> None:
    # huggingface_hub is in the stage's venv on the downloading host only: this file runs on the standard library
    from huggingface_hub import snapshot_download

    token_file = job.get("token_file")
    token = Path(token_file).read_text().strip() if token_file and Path(token_file).exists() else False
    for rel in paths:  # a corrupt file must go before huggingface_hub would trust it as complete
        tree.unlink(rel)
    watch_answers(job)
    try:
        while True:
            try:
                snapshot_download(job["repo"], revision=job["commit"], local_dir=job["dest"],
                                  endpoint=job["endpoint"], token=token, allow_patterns=paths, max_workers=WORKERS)
                break
            except Exception as error:  # a 503 the library does not retry: where the hub asked, again (resumed)
                named = next((e for e in causes(error) if isinstance(e, FetchError)), None)
                if named:  # our own line, raised through the library (every download thread has ended)
                    raise named from None
                wait = retry_asked(error, job)
                if wait is None:
                    raise
                time.sleep(wait)
    except FetchError:
        raise
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise
        raise source_failed(job, error) from error
    except Exception as error:  # huggingface_hub's HTTP errors carry no common base we can import here
        raise source_failed(job, error) from error


# How a source answered badly, for the lines that name it: the last refusal (status, Retry-After, file, when).
ANSWERS: dict = {}
HUB_PARTIAL = ".incomplete"  # huggingface_hub's own partial file, under the destination's .cache/huggingface
SERVER_UNIT: list[str] = []  # a swarm receiver's own fan-out server: it stops with the fetch's failure
TREES: list = []  # the destinations of this fetch: their partial files go when it fails


def give_up(tree) -> None:
    """A failing or orphaned fetch leaves nothing of its own: its partial files, huggingface_hub's partial
    files in the destination (no later download resumes them) and, on a swarm receiver, its own server
    (pyinfra runs no further operation on a failed host: it would serve until its idle timeout)."""
    tree.drop_temps()
    with contextlib.suppress(OSError):
        for rel, st, _ in tree.entries():
            if rel.startswith(".cache/huggingface/") and rel.endswith(HUB_PARTIAL) and stat.S_ISREG(st.st_mode):
                tree.unlink(rel)
    for unit in SERVER_UNIT:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["systemctl", "stop", unit], capture_output=True, timeout=30)


def answered(asked: dict) -> str:
    after = f", asking to retry after {asked['retry_after']} s" if asked.get("retry_after") is not None else ""
    return f"answered HTTP {asked['status']}{after} (for {asked['file']})"


def watch_answers(job: dict) -> None:
    """Note each refusal the hub answers (huggingface_hub retries 429s itself, sleeping Retry-After): the lines
    name the status, not a frozen source; a retry asked beyond the run's deadline (model_stall_s) ends the fetch
    at once, in one line (raised through the library, so its partial files go once its threads have ended)."""
    # huggingface_hub is in the stage's venv on the downloading host only: this file runs on the standard library
    from huggingface_hub import set_client_factory
    from huggingface_hub.utils._http import default_client_factory

    stall_s = float(job.get("stall_s") or 60)

    def hook(response) -> None:
        if response.status_code not in (408, 429, 500, 502, 503, 504):
            return
        wait = response.headers.get("Retry-After", "")
        asked = {"status": response.status_code, "retry_after": int(wait) if wait.isdigit() else None,
                 "file": response.url.path.split("/resolve/", 1)[-1].split("/", 1)[-1], "at": time.monotonic()}
        ANSWERS["last"] = asked
        if asked["retry_after"] is not None and asked["retry_after"] >= stall_s:
            raise FetchError(f"host {job.get('host') or 'this host'}: the hub ({job['endpoint']}) {answered(asked)}, "
                             f"beyond the run's deadline (model_stall_s {stall_s:g} s): files already verified are "
                             "kept, partial files removed, the other hosts go on; re-run when it serves again")

    def factory():
        client = default_client_factory()
        client.event_hooks = {**client.event_hooks, "response": [*client.event_hooks.get("response", []), hook]}
        return client

    set_client_factory(factory)


def retry_asked(error: BaseException, job: dict) -> float | None:
    """The wait a 429 or 503 the library gave up on asked for (Retry-After), within the run's deadline; None:
    not such an answer, or no wait asked (the error is the line)."""
    response = getattr(error, "response", None)
    wait = str(getattr(response, "headers", {}).get("Retry-After", "")) if response is not None else ""
    if getattr(response, "status_code", None) in (429, 503) and wait.isdigit() \
            and int(wait) < float(job.get("stall_s") or 60):
        return int(wait)
    return None


def causes(error: BaseException) -> list[BaseException]:
    """The error and what it was raised from or during (huggingface_hub wraps httpx's, which wraps the OS's)."""
    chain, seen = [], error
    while seen is not None and len(chain) < 10:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


def source_failed(job: dict, error: BaseException) -> FetchError:
    """The hub's failure in one line naming the host and the real cause: the status it answered, a name that
    does not resolve, or the library's own words."""
    where = f"host {job.get('host') or 'this host'}: the hub ({job['endpoint']})"
    chain = causes(error)
    text = " ".join(str(e) for e in chain)
    if any(isinstance(e, socket.gaierror) for e in chain) or re.search(
            r"name resolution|Name or service not known|nodename nor servname|No address associated", text):
        name = urllib.parse.urlparse(job["endpoint"]).hostname
        return FetchError(f"host {job.get('host') or 'this host'}: the hub's name {name} does not resolve there "
                          f"({job['endpoint']}): check the host's resolver (/etc/resolv.conf, /etc/hosts); files "
                          "already verified are kept, the other hosts go on; re-run when it resolves")
    response = next((getattr(e, "response", None) for e in chain if getattr(e, "response", None) is not None), None)
    if response is not None and getattr(response, "status_code", 200) >= 400:
        wait = response.headers.get("Retry-After")
        asked = {"status": response.status_code, "retry_after": wait,
                 "file": str(response.url).split("/resolve/", 1)[-1].split("/", 1)[-1]}
        return FetchError(f"{where} {answered(asked)}: files already verified are kept, partial files removed, "
                          "the other hosts go on; re-run when it serves again")
    return FetchError(f"{where} failed during the download: {one_line(error)}; files already verified are kept, "
                      "re-run when it answers")


def disk_full(error: OSError) -> str:
    """ENOSPC as one line: the host, the filesystem, the bytes the download still needs and those free."""
    job, dest = CONTEXT.get("job") or {}, Path(CONTEXT.get("dest") or ".")
    mount = dest
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    with contextlib.suppress(OSError):
        st = os.statvfs(dest)
        CONTEXT["free"] = st.f_bavail * st.f_frsize
    return (f"disk full on host {job.get('host') or 'this host'}, filesystem {mount}: {CONTEXT.get('needed', 0)} bytes "
            f"needed for {len(CONTEXT.get('missing', []))} file(s) of {job.get('repo', 'the checkpoint')} into "
            f"{dest}, {CONTEXT.get('free', 0)} free ({getattr(error, 'filename', None) or 'writing'}); partial "
            "files removed, verified files kept; free space there (or move model_root to a larger disk) and re-run")


CONTEXT: dict = {}


def proof(key: str, nonce: str, name: str, where: str) -> str:
    """What host `name`'s server, listening at `where` (address:port), answers to a nonce: only a holder of that
    host's proof key (made for the run by the control node, given to that server and to its receivers alone) can
    give it, and only for that host and that address. Relayed to another server of the run, the answer is that
    server's, which the receiver refuses."""
    message = f"modelfleet-fanout:{name}:{where}:{nonce}".encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def dialled(base_url: str) -> str:
    """address:port of a base URL, as a server's proof names where it listens."""
    parts = urllib.parse.urlsplit(base_url)
    return f"{parts.hostname}:{parts.port or 80}"


def challenge(base_url: str, key: str, name: str, timeout: float = 10) -> str | None:
    """None when the listener at base_url answers a fresh nonce as only host `name`'s server of this run, dialled
    there, can; else what went wrong. Neither the token nor the key is sent: a squatter on the port learns
    nothing from this, and what it gets by relaying the nonce to another server is no proof."""
    nonce = secrets.token_hex(16)
    request = urllib.request.Request(base_url.rstrip("/") + CHALLENGE, headers={"X-Modelfleet-Nonce": nonce})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = response.read(200).decode(errors="replace").strip()
    except urllib.error.HTTPError as error:
        return f"it answered HTTP {error.code}"
    except (OSError, http.client.HTTPException) as error:
        return f"no answer ({one_line(error)})"
    expected = proof(key, nonce, name, dialled(base_url))
    return None if hmac.compare_digest(answer, expected) else f"its answer is not {name}'s proof for this run"


def proof_key(job: dict, name: str | None) -> str | None:
    """The proof key of peer `name`'s server, from the job (the control node gives a receiver its sources'
    keys only); None when the job has none for it."""
    return (job.get("proofs") or {}).get(name) if name else None


def fetch_from_peer(job: dict, paths: list[str], base_url: str, name: str | None = None,
                    watch: Watchdog | None = None, tree: Tree | None = None) -> dict:
    """Copy each file, hashing while it streams; returns {path: sha256} so no second read is needed. `name`:
    the source host's, for the messages. The source proves it is the run's server on that host before it gets
    the token. No file gets more bytes than the control node says it has."""
    tree = tree or Tree(job["dest"])
    source = f"{name} ({base_url})" if name else base_url
    token = job.get("token")  # a peer's server; none for a mirror (model_source), which answers anyone
    key = proof_key(job, name)
    wrong = (challenge(base_url, key, name) if key else "this run gave no proof key for it") if token else None
    if wrong:
        raise FetchError(f"the source {source} did not prove it is this run's fan-out server ({wrong}): another "
                         "process may hold its port; nothing was asked of it; fix the source host and re-run")
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    def one(rel):
        expected = int(job["files"][rel]["size"])
        fd, temp = tree.create(rel)  # ours alone, beside the file
        digest, got, length = hashlib.sha256(), 0, None
        url = f"{base_url.rstrip('/')}/{urllib.parse.quote(rel)}"
        try:
            with os.fdopen(fd, "wb") as f, \
                    urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                           timeout=float(job.get("stall_s") or 60) + 5) as response:
                length = response.headers.get("Content-Length")
                if length is not None and length.isdigit() and int(length) > expected:
                    raise Oversized(f"it announced {length} bytes")
                buffer = memoryview(bytearray(RECV))  # one buffer per stream: no allocation per block
                # One byte more than is left, at most: a source that sends more is caught, not written.
                while n := response.readinto(buffer[:min(RECV, expected - got + 1)]):
                    keep = min(n, expected - got)
                    f.write(buffer[:keep])
                    digest.update(buffer[:keep])
                    got += keep
                    if watch:
                        watch.moved(keep)
                    if n > keep:
                        raise Oversized("it sent more")
        except Oversized as error:
            tree.unlink(temp)
            raise FetchError(f"the source {source} sent more than the {expected} bytes of {rel} the control node "
                             f"read ({error}): the copy stopped there and its partial file was removed; that host's "
                             "server is not this run's honest one: fix the source host and re-run") from None
        except urllib.error.HTTPError as error:
            tree.unlink(temp)
            if not token and error.code in (408, 429, 500, 502, 503, 504):  # a mirror that answers badly
                wait = mirror_retry(job, base_url, rel, error)
                time.sleep(wait)
                return one(rel)  # again, where the mirror asked, within the run's deadline
            raise FetchError(f"the source {source} refused {rel} (HTTP {error.code}): it does not serve that "
                             "file of this run; fix the source host and re-run") from error
        except urllib.error.URLError as error:
            tree.unlink(temp)
            raise FetchError(f"the source {source} stopped answering ({one_line(error)}): its host failed or "
                             "its run ended; fix the source host and re-run") from error
        except (ConnectionError, TimeoutError, http.client.HTTPException) as error:
            tree.unlink(temp)
            raise stopped(source, rel, one_line(error)) from error
        except BaseException:
            tree.unlink(temp)
            raise
        if length is not None and got != int(length):  # the server closed early: a short read, not an error
            tree.unlink(temp)
            raise stopped(source, rel, f"{got} of {length} bytes")
        tree.rename(temp, rel)
        return rel, digest.hexdigest()

    with ThreadPoolExecutor(WORKERS) as pool:
        return dict(pool.map(one, paths))


REFUSED_SINCE: dict[str, float] = {}  # a mirror's file -> when it first refused it (the deadline counts from there)


def mirror_retry(job: dict, base_url: str, rel: str, error: urllib.error.HTTPError) -> float:
    """The wait a mirror asked for (Retry-After) before `rel` is asked again, while the run's deadline
    (model_stall_s since its first refusal of that file) allows it; else the one line naming it."""
    stall_s, now = float(job.get("stall_s") or 60), time.monotonic()
    since = REFUSED_SINCE.setdefault(rel, now)
    wait = (error.headers or {}).get("Retry-After", "")
    asked = {"status": error.code, "retry_after": int(wait) if wait.isdigit() else None, "file": rel}
    ANSWERS["last"] = {**asked, "at": now}  # the watchdog names the status, not a frozen source
    if asked["retry_after"] is not None and now - since + asked["retry_after"] < stall_s:
        return max(1, asked["retry_after"])
    beyond = f", beyond the run's deadline (model_stall_s {stall_s:g} s)" if asked["retry_after"] is not None else ""
    raise FetchError(f"host {job.get('host') or 'this host'}: the mirror ({base_url}) {answered(asked)}"
                     f"{beyond}: files already verified are kept, partial files removed, "
                     "the other hosts go on; re-run when it serves again") from error


def whole_file_wrong(tree: Tree, rel: str, meta: dict) -> tuple[str, str] | None:
    """None when `rel` below `tree` is the file `meta` (the control node's) describes, else (expected, found)."""
    if meta.get("sha256"):
        found = sha256_of(rel, tree)
        return None if found == meta["sha256"] else (f"sha256 {meta['sha256']}", f"sha256 {found}")
    if meta.get("blob_id"):
        found = git_blob_id(rel, tree)
        return None if found == meta["blob_id"] else (f"git blob {meta['blob_id']}", f"git blob {found}")
    size = tree.size(rel)
    return None if size == meta["size"] else (f"{meta['size']} bytes", f"{size} bytes")


def fetch_from_swarm(job: dict, paths: list[str], complete: list[str], watch: Watchdog, report: dict,
                     tree: Tree) -> dict:
    """Copy `paths` piece by piece from the group's peers (modelfleet_swarm), serving what is verified meanwhile.
    Each peer proves it is the run's server before it gets the token; one that cannot is named and left out."""
    # modelfleet_swarm lies beside this file on hosts; the control node (mirror) loads this file alone
    from modelfleet_swarm import Swarm

    peers, unproven = {}, []
    for name, url in sorted(job["peers"].items()):
        key = proof_key(job, name)
        wrong = challenge(url, key, name) if key else "this run gave no proof key for it"
        if wrong:
            unproven.append(f"{name} ({wrong})")
        else:
            peers[name] = url
    if not peers:
        raise FetchError(f"no peer of the group proved it is this run's fan-out server ({', '.join(unproven)}): "
                         "nothing was asked of them; fix those hosts and re-run")
    swarm = Swarm({**job, "peers": peers}, paths, complete, partial(whole_file_wrong, tree), tree,
                  Pace(job["rate_mb_s"] * 1e6) if job.get("rate_mb_s") else None, watch.moved)
    def source() -> str:  # for the stall line: the peers that stopped answering or were asked and send nothing
        now = time.monotonic()
        gone = [name for name in sorted(swarm.lost) if now < swarm.down_until.get(name, 0) + 5]
        asked = [name for name in sorted(peers) if swarm.active.get(name) and name not in gone]
        said = [f"source {name} ({peers[name]}) stopped answering" for name in gone]
        said += [f"peer {name} ({peers[name]}) was asked and sends nothing" for name in asked]
        return "the group's peers" + (f" ({'; '.join(said)})" if said else "")

    watch.source = source
    digests = swarm.run()
    report.update(peers=sorted(peers), unproven_peers=unproven, refused_pieces=swarm.refused,
                  peers_lost=sorted(swarm.lost), bytes_by_peer=swarm.received)
    if isinstance(swarm.failed_with, OSError) and swarm.failed_with.errno == errno.ENOSPC:
        raise swarm.failed_with  # run() names the host, the filesystem and the bytes needed
    if swarm.failure:
        raise FetchError(f"the copy from the group's peers failed: {swarm.failure}; files already verified are "
                         "kept, re-run")
    return digests


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


def open_beneath(root: int, rel: str) -> int:
    """A read descriptor of the regular file `rel` below the directory `root` (a descriptor), each component
    opened without following a symlink: nothing outside the tree, no device, no setuid file."""
    parts = rel.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise PermissionError(rel)
    fd = os.dup(root)
    try:
        for part in parts[:-1]:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = inner
        leaf = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)
    mode = os.fstat(leaf).st_mode
    if not stat.S_ISREG(mode) or mode & (stat.S_ISUID | stat.S_ISGID):
        os.close(leaf)
        raise PermissionError(rel)
    return leaf


def serve(job: dict) -> None:
    """HTTP for the run's peers: GET of a name the job lists, with the run's token; files go out with
    sendfile(2), no copy through Python, paced to the job's `rate_mb_s` in all when given. Long because its
    handler class is defined inside it: every check a request passes reads the job and the pacing state it closes
    over, and nothing of it is reachable but through this one listener."""
    # modelfleet_swarm lies beside this file on hosts; the control node (mirror) loads this file alone
    from modelfleet_swarm import HAVE, HAVE_PATH, PIECE, SENDING, HaveView, piece_of

    token, names = job["token"], frozenset(job["files"])
    expected = f"Bearer {token}".encode()
    key, me, where = job["proof_key"], job["name"], f"{job['address']}:{job['port']}".lower()  # as urlsplit
    root = os.open(job["dir"], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    pace = Pace(job["rate_mb_s"] * 1e6) if job.get("rate_mb_s") else None
    piece = int(job.get("piece_size") or PIECE)

    def read_have() -> bytes:
        with os.fdopen(open_beneath(root, HAVE), "rb") as f:
            return f.read()

    # A holder sends every listed file; a receiver of a swarm only the pieces its fetch verified (HAVE).
    view = HaveView(read_have, names, complete=not job.get("swarm"))
    slots = threading.BoundedSemaphore(int(job.get("slots") or 4))  # pieces sent at once: each goes out fast
    sending: set[tuple[str, int]] = set()

    idle_s = float(job.get("idle_s") or 0)
    # `open`: requests with the token being answered; `unproven`: connections that have not shown it yet, by
    # peer address, each closed after HEADER_S without a request.
    guard, activity = threading.Lock(), {"open": 0, "last": time.monotonic(), "connections": 0}
    unproven: dict[str, int] = {}
    proven: set = set()  # the connections whose request showed the token

    def forget(peer: str) -> None:
        unproven[peer] -= 1
        if not unproven[peer]:
            del unproven[peer]

    def lease() -> None:
        """The run renews the server's lease by asking it with the token (its probe, its receivers): with no such
        request open or made for idle_s, the run that started it is gone, or done with it, and so is the server.
        A connection without the token renews nothing."""
        while True:
            time.sleep(1)
            with guard:
                if not activity["open"] and time.monotonic() - activity["last"] > idle_s:
                    os._exit(0)

    class Handler(BaseHTTPRequestHandler):
        server_version, sys_version = "modelfleet", ""
        index = None
        timeout = HEADER_S  # the request line and headers, then each send (widened once the token is shown)

        def prove(self) -> None:
            """The request carries the token: it holds the lease and leaves its peer's unproven count."""
            with guard:
                if self.request in proven:  # HTTP/1.0: one request a connection, but never counted twice
                    return
                proven.add(self.request)
                activity["open"] += 1
                forget(self.client_address[0])
            self.connection.settimeout(max(idle_s, 60))  # a receiver paced or busy hashing reads slowly

        def answer(self, code: int, body: bytes = b"") -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802 (http.server's name)
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            if path == CHALLENGE:
                nonce = self.headers.get("X-Modelfleet-Nonce", "")
                return self.answer(200, proof(key, nonce, me, where).encode()) \
                    if re.fullmatch(r"[0-9a-f]{32,128}", nonce) else self.answer(400)
            if not hmac.compare_digest(self.headers.get("Authorization", "").encode(), expected):
                return self.answer(401)
            self.prove()
            if path == HAVE_PATH:
                held = {rel: e["have"] for rel, e in view.current().items()}
                with guard:  # what it is sending now: soon held by another, so no longer rare
                    held[SENDING] = sorted(f"{r}:{i}" for r, i in sending)
                return self.answer(200, json.dumps(held).encode())
            rel, ranged = path[1:], self.headers.get("Range")
            if rel not in names:
                return self.answer(404)
            if ranged is None:
                return self.whole(rel)
            if not slots.acquire(blocking=False):
                return self.answer(503)
            try:
                self.ranged(rel, ranged)
            finally:
                slots.release()
                with guard:
                    sending.discard((rel, self.index))

        def whole(self, rel: str) -> None:
            where = view.source(rel, None)
            try:
                fd = open_beneath(root, where) if where else None
            except OSError:
                return self.answer(403)
            if fd is None:
                return self.answer(404)
            with os.fdopen(fd, "rb") as source:
                size = os.fstat(fd).st_size
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                self.wfile.flush()
                self.send_file(source, 0, size)

        def ranged(self, rel: str, ranged: str) -> None:
            """One whole piece this host has verified (206), else 416 (not a piece) or 404 (not held yet)."""
            try:
                size = int(job["sizes"][rel])
            except (OSError, KeyError, TypeError, ValueError):
                return self.answer(404)
            index = self.index = piece_of(ranged, size, piece)
            if index is None:
                return self.answer(416)
            where = view.source(rel, index)
            try:
                fd = open_beneath(root, where) if where else None
            except OSError:
                return self.answer(404)  # a partial that took its name meanwhile: asked again
            if fd is None:
                return self.answer(404)
            offset = index * piece
            length = min(piece, size - offset)
            with guard:
                sending.add((rel, index))
            with os.fdopen(fd, "rb") as source:
                self.send_response(206)
                self.send_header("Content-Length", str(length))
                self.send_header("Content-Range", f"bytes {offset}-{offset + length - 1}/{size}")
                self.end_headers()
                self.wfile.flush()
                self.send_file(source, offset, length)

        def send_file(self, source, offset: int, length: int) -> None:
            end = offset + length
            while offset < end:
                if pace:
                    pace.wait(min(CHUNK, end - offset))
                sent = self.connection.sendfile(source, offset, min(CHUNK, end - offset))
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
        # SO_REUSEADDR: bind past the TIME_WAIT of an earlier run's connections. On Linux it never lets two
        # sockets listen on one port (that takes SO_REUSEPORT, set by neither): a squatter still refuses us.
        allow_reuse_address = True

        def verify_request(self, request, client_address) -> bool:
            """A connection beyond MAX_CONNECTIONS in all, or beyond UNPROVEN_PER_PEER from one address that has
            not shown the token yet, is closed at once: no thread, no lease, for what an attacker holds open."""
            with guard:
                peer = client_address[0]
                if activity["connections"] >= MAX_CONNECTIONS or unproven.get(peer, 0) >= UNPROVEN_PER_PEER:
                    return False
                activity["connections"] += 1
                unproven[peer] = unproven.get(peer, 0) + 1
            return True

        def process_request_thread(self, request, client_address):
            try:
                super().process_request_thread(request, client_address)
            finally:
                with guard:
                    activity["connections"] -= 1
                    if request in proven:
                        proven.discard(request)
                        activity["open"] -= 1
                        activity["last"] = time.monotonic()
                    else:
                        forget(client_address[0])

    server = Server((job["address"], int(job["port"])), Handler)
    if idle_s:
        threading.Thread(target=lease, daemon=True).start()
    server.serve_forever()


def listener_of(port: int, address: str | None = None) -> str | None:
    """Who listens on `address`:`port` on this host (a swarm's peers listen on the same port at their own
    addresses, in one network namespace on the lab), as `ss` names it (process, pid, user), for the one-line refusal;
    None when nothing does. Where `ss` cannot name the process (root without CAP_SYS_PTRACE, as in a container,
    cannot read another user's descriptors), the socket's owner and that user's processes."""
    try:
        where = ["src", f"{address}:{port}"] if address else [f"sport = :{port}"]
        shown = subprocess.run(["ss", "-Hltnpe", *where], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "a process `ss` could not name"
    if not shown.strip():
        return None

    def uid_of(pid: str) -> str:
        try:
            return next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                        if line.startswith("Uid:"))
        except (OSError, StopIteration):
            return "?"

    found = sorted(set(re.findall(r'\("([^"]+)",pid=(\d+)', shown)))
    if found:
        return ", ".join(f"{command} pid {pid} uid {uid_of(pid)}" for command, pid in found)
    owned = re.search(r"\buid:(\d+)", shown)
    owner = owned.group(1) if owned else "0"  # ss omits uid 0
    theirs = []
    for proc in sorted(Path("/proc").glob("[0-9]*"), key=lambda p: int(p.name)):
        if uid_of(proc.name) == owner and len(theirs) < 3:
            with contextlib.suppress(OSError):
                theirs.append(f"{(proc / 'comm').read_text().strip()} pid {proc.name}")
    return (f"a process of uid {owner} that `ss` could not name (that user's processes: "
            f"{', '.join(theirs) or 'none visible'})")


def probe(job_path: str, host_name: str, wait_s: float = 10) -> None:
    """Wait for the run's server to answer its challenge on the job's address and port, or fail naming what
    holds the port instead."""
    job = json.loads(Path(job_path).read_text())
    url = f"http://{job['address']}:{job['port']}/"
    deadline, wrong = time.monotonic() + wait_s, None
    while time.monotonic() < deadline:
        wrong = challenge(url, job["proof_key"], job.get("name") or host_name, timeout=2)
        if wrong is None:  # proven: the token renews its lease (only a request with the token does)
            # modelfleet_swarm lies beside this file on hosts; the control node (mirror) loads this file alone
            from modelfleet_swarm import HAVE_PATH

            renew = urllib.request.Request(url.rstrip("/") + HAVE_PATH,
                                           headers={"Authorization": f"Bearer {job['token']}"})
            with contextlib.suppress(OSError, http.client.HTTPException), urllib.request.urlopen(renew, timeout=5):
                pass
            return
        if not wrong.startswith("no answer (URLError: <urlopen error [Errno 111]"):  # someone answered
            break
        time.sleep(0.2)
    holder = listener_of(int(job["port"]), job["address"])
    if holder is None:
        raise FetchError(f"host {host_name}: the fan-out server did not start on {job['address']}:{job['port']} "
                         f"({wrong}); see `journalctl -u modelfleet-fanout-*` there; no peer copies from this host")
    raise FetchError(f"host {host_name}: fan-out port {job['address']}:{job['port']} is held by {holder}, not by "
                     f"this run's server ({wrong}): no peer copies from this host; stop that process and re-run")


def one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def started(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, /proc/PID/stat field 22): with the pid, its identity."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def session_of(pid: int) -> tuple[int, str] | None:
    """The sshd process (pid, start time) of the SSH session that started `pid` (its nearest sshd ancestor),
    or None where none did."""
    while pid > 1:
        try:
            stat_line = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        if Path(f"/proc/{pid}/comm").read_text().strip().startswith("sshd") and pid != os.getpid():
            return pid, started(pid) or "?"
        pid = int(stat_line.rsplit(")", 1)[1].split()[1])
    return None


def holder_gone(record: str) -> int | None:
    """The pid of the lock's holder when that process is still the one that wrote `record` (pid and start time
    match) and the SSH session that started it has ended: a fetch whose run is gone. Else None."""
    try:
        pid, start, session, session_start = record.split()
        pid, session = int(pid), int(session)
    except ValueError:
        return None
    if started(pid) != start:
        return None
    return pid if started(session) != session_start else None


def locked(dest, name: str = ".modelfleet-lock", what: str = "fetch"):
    """This destination's lock (`name`, below a Tree or a path), or a FetchError naming the process that holds
    it. A holder whose run is gone (checked by pid, start time and its SSH session) is stopped and the lock taken
    over. The lock file is opened without following a link and is written only once it is known to be a
    regular file of one link: what a container planted under its name is refused, never truncated."""
    tree = as_tree(dest)
    dest = tree.path
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600,
                     dir_fd=tree.fd)
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
        raise FetchError(f"{dest}/{name} is a symlink (to {os.readlink(name, dir_fd=tree.fd)}): refusing to "
                         "open it; find out who planted it, remove it and re-run") from None
    held = os.fstat(fd)
    if not stat.S_ISREG(held.st_mode) or held.st_nlink != 1:
        os.close(fd)
        what = "a hard link" if stat.S_ISREG(held.st_mode) else "not a regular file"
        raise FetchError(f"{dest}/{name} is not a plain file ({what}): refusing to use it as a lock; find out who "
                         "made it, remove it and re-run")
    handle = os.fdopen(fd, "r+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        record = handle.read().strip()
        orphan = holder_gone(record)
        if orphan is None:
            raise FetchError(f"another {what} into {dest} is running (pid {record.split()[0] if record else '?'}), "
                             "started by a run that is still connected; wait for it or stop it, then re-run") from None
        os.kill(orphan, signal.SIGTERM)
        for _ in range(100):
            time.sleep(0.1)
            with contextlib.suppress(BlockingIOError):
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
        else:
            os.kill(orphan, signal.SIGKILL)
            fcntl.flock(handle, fcntl.LOCK_EX)
    session = session_of(os.getpid())
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()} {started(os.getpid())} {session[0] if session else 0} "
                 f"{session[1] if session else '-'}")
    handle.flush()
    return handle


def own_files(tree: Tree) -> list[str]:
    """What an index covers: every regular file but modelfleet's own (.modelfleet-*) and partial copies. What
    an engine cache may not hold (a symlink, a device, a pipe or socket, a setuid or setgid file) is refused,
    every such path named: a cache other hosts' engines will run is never taken from such a directory."""
    refused = tree.odd()
    if refused:
        raise FetchError(f"{tree.path} holds what no cache may hold: {', '.join(refused[:10])}: nothing of it is "
                         "indexed or given to peers; find out who wrote it, remove it (or the directory) and re-run")
    return sorted(rel for rel, st, _ in tree.entries() if stat.S_ISREG(st.st_mode)
                  and not rel.rsplit("/", 1)[-1].startswith(".modelfleet-") and not rel.endswith(PARTIAL))


def _grant(fd: int, bits: int) -> None:
    mode = os.fstat(fd).st_mode
    if mode & bits != bits:
        os.fchmod(fd, stat.S_IMODE(mode) | bits)


def readable_to_peers(tree: Tree, rels: list[str]) -> None:
    """The peer server runs unprivileged (DynamicUser) and an engine writes its cache as mkstemp and mkdtemp
    make them, 0600 files and 0700 directories (vLLM 0.32.0's modelinfos file: the server answered 403 and the
    joining host failed): the indexed files become readable by all, their directories searchable, as the
    cache's own directory is. Each component opened without following a symlink; only regular files of one
    link (a hard link may be a file from elsewhere: left as it is, the server refuses it and the copy fails)."""
    for rel in rels:
        *parents, leaf_name = rel.split("/")
        fd = os.dup(tree.fd)
        try:
            for part in parents:
                inner = os.open(part, DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = inner
                _grant(fd, 0o055)
            leaf = os.open(leaf_name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        finally:
            os.close(fd)
        try:
            held = os.fstat(leaf)
            if stat.S_ISREG(held.st_mode) and held.st_nlink == 1:
                _grant(leaf, 0o044)
        finally:
            os.close(leaf)


def index(directory: Path, name: str) -> dict:
    """DIR's manifest from its files as they are now, written whole or not at all; returned whole, so the
    control node reads the digests from this command's output."""
    tree = Tree(directory)  # an engine container writes there: nothing followed, nothing named predictably
    lock = locked(tree)  # noqa: F841 (no fetch into it meanwhile)
    start = time.monotonic()
    rels = own_files(tree)
    readable_to_peers(tree, rels)
    files = {rel: {"size": tree.size(rel), "sha256": None} for rel in rels}
    verified, _ = check(tree, files, {}, True)
    tree.write(MANIFEST, (json.dumps({"repo": name, "commit": directory.name, "files": verified,
                                      "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                                     indent=1) + "\n").encode())
    return {"indexed": str(directory), "files": len(verified), "bytes": sum(e["size"] for e in verified.values()),
            "seconds": round(time.monotonic() - start, 3), "manifest": verified}


def main(argv: list[str]) -> int:
    # One branch per command of the module's docstring, in its order: a table would hide their different argv.
    if argv[0] == "serve":  # the job on stdin: systemd opened the 0600 file this unprivileged server cannot
        serve(json.load(sys.stdin))
        return 0
    if argv[0] == "probe":
        probe(argv[1], argv[2])
        return 0
    if argv[0] == "index":
        print(json.dumps(index(Path(argv[1]), argv[2])))
        return 0
    if argv[0] == "pieces":  # the verified copy's piece digests, for the control node to hand the receivers
        # modelfleet_swarm lies beside this file on hosts; the control node (mirror) loads this file alone
        from modelfleet_swarm import pieces_of

        tree = Tree(argv[1])
        manifest = json.loads(tree.read(MANIFEST) or b"{}")["files"]
        print(json.dumps(pieces_of(tree, sorted(manifest), int(argv[2]))))
        return 0
    job = json.loads(Path(argv[0]).read_text())
    if job.get("token"):  # a peer copy's job holds the run's token: on disk no longer than it is read
        Path(argv[0]).unlink(missing_ok=True)
    mode, reverify = argv[1], "--reverify" in argv
    dest = Path(job["dest"])
    dest.mkdir(parents=True, exist_ok=True)
    tree = Tree(dest)  # an engine cache's is written by its engine's container too: nothing followed there
    lock = locked(tree)  # noqa: F841 (held until the process exits)
    if job.get("kind") == "cache" and (odd := tree.odd()):
        raise FetchError(f"engine cache {job['commit']}: {dest} holds what no cache may hold: {', '.join(odd[:10])}: "
                         "nothing was copied into it; its engine's container can write there: find out who wrote "
                         "it, remove it (or the directory) and re-run")
    watch = Watchdog(job, tree)
    watch.start()
    TREES.append(tree)
    SERVER_UNIT.extend([job["server_unit"]] if job.get("server_unit") else [])
    try:
        manifest = json.loads(tree.read(MANIFEST) or b"{}").get("files", {})
    except (OSError, ValueError):
        manifest = {}
    files = job["files"]
    start = time.monotonic()
    bad: dict = {}
    verified, missing = check(tree, files, manifest, reverify, bad=bad)
    report = {"commit": job["commit"], "dest": str(dest), "files": len(files), "fetched": [], "bytes_fetched": 0}
    if missing and mode != "verify":
        name = next((a.split("=", 1)[1] for a in argv if a.startswith("--source-name=")), None)
        waiting = missing
        source = f"peer {name} ({argv[2]})" if name else f"the mirror ({argv[2]})" if mode == "peer" \
            else "the group's peers" if mode == "swarm" else f"the hub ({job['endpoint']})"
        watch.arm(source, lambda: [rel for rel in waiting if tree.size(rel) != files[rel]["size"]])
        CONTEXT.update(job=job, dest=str(dest), missing=missing,
                       needed=sum(files[rel]["size"] for rel in missing))
        if mode == "swarm":
            streamed = fetch_from_swarm(job, missing, sorted(verified), watch, report, tree)
        else:
            streamed = fetch_from_hub(job, missing, tree) if mode == "hub" else \
                fetch_from_peer(job, missing, argv[2], name, watch, tree)
        watch.armed = False
        report["fetched"] = missing
        report["bytes_fetched"] = sum(files[rel]["size"] for rel in missing)
        again, still = check(tree, {rel: files[rel] for rel in missing}, {}, True, streamed or {})
        verified.update(again)
        missing = still
        for rel in missing:  # what failed its check goes: an engine reads its cache directory as it finds it
            tree.unlink(rel)
    report.update(ok=not missing, missing_or_corrupt=missing, seconds=round(time.monotonic() - start, 3),
                  finished_at=round(time.time(), 3),
                  repaired=[{"file": rel, "expected": e, "found": f} for rel, (e, f) in sorted(bad.items())
                            if rel not in missing and mode != "verify"])
    if missing:
        raise refusal(job, missing, mode, argv[2] if mode == "peer" else None,
                      next((a.split("=", 1)[1] for a in argv if a.startswith("--source-name=")), None))
    tree.write(MANIFEST, (json.dumps({"repo": job["repo"], "commit": job["commit"], "files": verified,
                                      "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                                     indent=1) + "\n").encode())
    print(json.dumps(report))
    return 0


def refusal(job: dict, missing: list[str], mode: str, url: str | None, peer: str | None) -> FetchError:
    """Files that failed their check after fetching (removed already): named, with the source that sent the
    bytes and how to repair it."""
    files = ", ".join(missing[:5])
    if job.get("kind") == "cache":
        return FetchError(f"engine cache {job['commit']}: {len(missing)} file(s) sent by peer {peer or url} do not "
                          f"match the sizes and sha256s the control node read from its index ({files}); they were "
                          f"removed; that peer's cache is bad: remove its cache directory ({job['dest']} there) so "
                          "its engine compiles again, and re-run")
    what = f"refused {job['repo']}@{job['commit'][:12]}: {len(missing)} file(s) ({files})"
    if peer:
        return FetchError(f"{what} sent by peer {peer} do not match the sizes and sha256s the control node read from "
                          f"the hub; they were removed; `current` stays where it was; {peer}'s copy is bad: run with "
                          f"model_reverify=true on {peer} (--limit {peer}), then re-run")
    source = f"the mirror ({url})" if url else f"the hub ({job['endpoint']})"
    return FetchError(f"{what} sent by {source} do not match the sizes and checksums the control node read from it; "
                      "they were removed; `current` stays where it was; check that source and re-run")


def run(argv: list[str]) -> int:
    """main(), with every failure as one line on stderr: what else the libraries print (progress bars,
    warnings) and the traceback go to a log beside the job (JOB.json.log)."""
    if not argv or argv[0] == "serve":
        return main(argv)
    if argv[0] in ("index", "probe"):  # one line on stderr, exit 1, no log file
        try:
            return main(argv)
        except FetchError as error:
            print(f"modelfleet: {error}", file=sys.stderr)
            return 1
    global LOG
    log = Path(f"{argv[0]}.log")
    LOG = str(log)
    real_stderr = sys.stderr
    try:
        sink = log.open("w")
    except OSError:
        sink = open(os.devnull, "w")
    sys.stderr = sink
    try:
        return main(argv)
    except Exception as error:
        for tree in TREES:
            give_up(tree)
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            message = disk_full(error)
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
