"""The piece-level fan-out (a swarm), beside modelfleet_fetch.py on every host, imported by it.

Every file is cut in pieces of `piece_size` bytes; the control node gives each receiver every piece's sha256 (read
over SSH from the seed, which computed them from its verified copy) and the group's peers. A receiver fetches
missing pieces with HTTP Range requests from every peer that says it has them (`/.modelfleet-have`, token
required), rarest first, at most PER_PEER at once from one peer; a piece counts only when its sha256 matches,
and only then is it written, marked in DEST/.modelfleet-have.json and so served by this host's own server to the
others while it still receives. A peer that sends a bad piece is named and never asked again; a peer that stops
answering is asked again later, its pieces fetched from the others meanwhile. A file whose pieces are all in is
checked whole against the control node's size and sha256 (or git blob id) before it takes its name.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import random
import re
import threading
import time
import urllib.parse
import zlib

PIECE = 8 << 20
HAVE = ".modelfleet-have.json"
HAVE_PATH = "/.modelfleet-have"
PIECES_CACHE = ".modelfleet-pieces.json"
PER_PEER = 2  # pieces one receiver asks of one peer at once: the others' requests get its uplink too
WORKERS = 6
POLL_S = 0.5
SENDING = "/sending"  # the key of a have answer that lists the pieces the server is sending now ("rel:index")
BUSY_S = 0.2  # a peer that said it is sending all it can (503) is asked again after this
RECV = 256 << 10


def piece_count(size: int, piece: int) -> int:
    return -(-size // piece)


def piece_range(size: int, piece: int, index: int) -> tuple[int, int]:
    """(offset, length) of piece `index` of a file of `size` bytes."""
    offset = index * piece
    return offset, min(piece, size - offset)


def piece_of(range_header: str, size: int, piece: int) -> int | None:
    """The piece index a `Range: bytes=A-B` header asks for, or None unless it is exactly one whole piece."""
    found = re.fullmatch(r"bytes=(\d+)-(\d+)", range_header.strip())
    if not found:
        return None
    start, end = int(found.group(1)), int(found.group(2))
    if start % piece or start >= size:
        return None
    index = start // piece
    offset, length = piece_range(size, piece, index)
    return index if end == offset + length - 1 else None


def digests(fd: int, piece: int) -> list[str]:
    out = []
    with os.fdopen(fd, "rb") as f:
        while block := f.read(piece):
            out.append(hashlib.sha256(block).hexdigest())
    return out


def pieces_of(tree, names: list[str], piece: int) -> dict:
    """Every piece's sha256 of the (verified) files `names` in `tree` (modelfleet_fetch.Tree: nothing followed,
    nothing named predictably), computed once per file version (size and mtime) and kept in PIECES_CACHE, so a
    seed's re-run reads nothing again."""
    cache = {}
    with contextlib.suppress(OSError, ValueError):
        cache = json.loads(tree.read(PIECES_CACHE) or b"{}")
    known = cache.get("files", {}) if cache.get("piece_size") == piece else {}
    out = {}
    for rel in names:
        fd = tree.open(rel)
        st = os.fstat(fd)
        entry = known.get(rel)
        if not entry or entry["size"] != st.st_size or entry["mtime"] != st.st_mtime:
            entry = {"size": st.st_size, "mtime": st.st_mtime, "pieces": digests(fd, piece)}
        else:
            os.close(fd)
        out[rel] = entry
    tree.write(PIECES_CACHE, json.dumps({"piece_size": piece, "files": out}).encode())
    return {"piece_size": piece, "files": {rel: e["pieces"] for rel, e in out.items()}}


class HaveView:
    """What this host's server may send (the server's side): every listed file whole (a holder), or, for a
    receiver, what its fetch wrote in HAVE: files complete ("*") and, per partial file, the verified pieces."""

    def __init__(self, read_have, names: frozenset, complete: bool):
        self.read_have, self.names, self.complete = read_have, names, complete

    def current(self) -> dict:
        """{rel: {"have": "*" | "0110...", "partial": name | None}} for the listed files this host can send."""
        if self.complete:
            return {rel: {"have": "*", "partial": None} for rel in self.names}
        try:
            listed = json.loads(self.read_have()).get("files", {})
        except (OSError, ValueError):
            return {}
        out = {}
        for rel, entry in listed.items():
            partial = entry.get("partial")
            if rel not in self.names or not isinstance(entry.get("have"), str):
                continue
            if partial is not None and not re.fullmatch(
                    rf"\.{re.escape(rel.rsplit('/', 1)[-1])}\.\d+\.[0-9a-f]+\.modelfleet-partial", str(partial)):
                continue  # a partial is only ever the listed file's own, beside it
            out[rel] = {"have": entry["have"], "partial": partial}
        return out

    def source(self, rel: str, index: int | None) -> str | None:
        """The path below the tree to read piece `index` of `rel` from (None: the whole file), or None when this
        host has not verified it."""
        entry = self.current().get(rel)
        if not entry:
            return None
        if entry["have"] == "*":
            return rel
        if index is None or index >= len(entry["have"]) or entry["have"][index] != "1" or not entry["partial"]:
            return None
        return "/".join(rel.split("/")[:-1] + [entry["partial"]])


class Swarm:
    """One receiver's copy of `paths` from the group's `peers` ({name: base url}), every piece checked against
    `pieces` ({rel: [sha256]}); `verify(rel, meta)` checks a whole file below `tree` (None, or (expected,
    found)); `tree`: the destination (modelfleet_fetch.Tree: every write by descriptor, nothing followed); `pace`:
    the host's receive cap (or None); `moved(n)`: progress for the watchdog."""

    def __init__(self, job: dict, paths: list[str], complete: list[str], verify, tree, pace=None, moved=None):
        self.tree, self.files, self.token = tree, job["files"], job["token"]
        self.piece, self.pieces = int(job["piece_size"]), job["pieces"]
        self.peers, self.verify, self.pace, self.moved = dict(job["peers"]), verify, pace, moved or (lambda n: None)
        self.timeout = float(job.get("stall_s") or 60)
        self.slot, self.slots = job.get("stripe") or (0, 1)  # this receiver's share: see mine()
        self.pieces_from = job.get("pieces_from") or "the seed"  # the host whose copy the piece digests describe
        self.cond = threading.Condition()
        self.views: dict[str, dict] = {}
        self.down_until: dict[str, float] = {}
        self.busy_until: dict[str, float] = {}
        self.sending: dict[str, set] = {}
        self.active = {name: 0 for name in self.peers}
        self.banned: dict[str, str] = {}
        self.refused: list[dict] = []
        self.lost: set[str] = set()
        self.received = {name: 0 for name in self.peers}  # verified bytes, by the peer that sent them
        self.digests: dict[str, str] = {}
        self.failure: str | None = None
        self.failed_with: BaseException | None = None  # the exception behind `failure` (a full disk is named)
        self.have = {rel: bytearray(b"0" * piece_count(self.files[rel]["size"], self.piece)) for rel in paths}
        self.partial: dict[str, str] = {}  # rel -> its partial file's path below the tree (a name no one guesses)
        self.todo = {(rel, i) for rel in paths for i in range(len(self.have[rel]))}
        self.inflight: set[tuple[str, int]] = set()
        self.left = {rel: len(self.have[rel]) for rel in paths}
        self.complete = set(complete)
        self.fds = {}
        for rel in paths:
            fd, self.partial[rel] = tree.create(rel)
            os.ftruncate(fd, self.files[rel]["size"])
            self.fds[rel] = fd
        self.write_have()
        for rel in [r for r in paths if not self.left[r]]:  # empty files: nothing to fetch
            self.finish(rel)

    def write_have(self) -> None:
        """HAVE, replaced whole: what this host's server may send now (written by root, read by the server)."""
        with self.cond:
            files = {rel: {"have": "*", "partial": None} for rel in self.complete}
            files.update({rel: {"have": bits.decode(), "partial": self.partial[rel].rsplit("/", 1)[-1]}
                          for rel, bits in self.have.items() if rel not in self.complete})
            text = json.dumps({"piece_size": self.piece, "files": files})
        self.tree.write(HAVE, text.encode())

    def request(self, name: str, path: str, headers: dict | None = None):
        parts = urllib.parse.urlsplit(self.peers[name])
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=self.timeout)
        connection.request("GET", path, headers={"Authorization": f"Bearer {self.token}", **(headers or {})})
        return connection, connection.getresponse()

    def poll(self) -> None:
        """Each peer's have, every POLL_S, until the copy ends."""
        while not self.done():
            for name in self.peers:
                if name in self.banned or time.monotonic() < self.down_until.get(name, 0):
                    continue
                try:
                    connection, response = self.request(name, HAVE_PATH)
                    with contextlib.closing(connection):
                        view = json.loads(response.read()) if response.status == 200 else None
                except (OSError, ValueError, http.client.HTTPException):
                    view = None
                with self.cond:
                    if view is None:
                        self.down(name)
                    else:
                        self.views[name] = {rel: v for rel, v in view.items() if isinstance(v, str)}
                        sent = view.get(SENDING)
                        self.sending[name] = {tuple(k.rsplit(":", 1)) for k in sent if isinstance(k, str)} \
                            if isinstance(sent, list) else set()
                    self.cond.notify_all()
            time.sleep(POLL_S)

    def down(self, name: str) -> None:
        """A peer that failed to answer: asked again in a second; its pieces come from the others meanwhile."""
        self.lost.add(name)
        self.down_until[name] = time.monotonic() + 1
        self.views.pop(name, None)
        self.sending.pop(name, None)

    def done(self) -> bool:
        with self.cond:
            return self.failure is not None or not self.todo and not self.inflight

    def has(self, name: str, rel: str, index: int) -> bool:
        bits = self.views.get(name, {}).get(rel)
        return bits == "*" or bits is not None and index < len(bits) and bits[index] == "1"

    def mine(self, key: tuple[str, int]) -> bool:
        """Whether a piece is in this receiver's share: among pieces equally rare, receivers ask for their own
        share first, so no two ask the seed for the same piece while it holds pieces no one else has."""
        return (zlib.crc32(key[0].encode()) + key[1]) % self.slots == self.slot

    def choose(self) -> tuple[tuple[str, int], str] | None:
        """The rarest piece not yet asked for that a free peer has, and the least busy such peer."""
        now, best, best_count = time.monotonic(), [], None
        usable = [n for n in self.peers if n not in self.banned and now >= self.down_until.get(n, 0)
                  and now >= self.busy_until.get(n, 0)]
        # A piece a peer is sending someone now counts as one more holder: the seed's uplink goes to pieces
        # no one else will have soon, not to a second copy of the one it is sending.
        sent = {(rel, int(i)) for keys in self.sending.values() for rel, i in keys if i.isdigit()}
        for key in self.todo - self.inflight:
            holders = [n for n in usable if self.has(n, *key)]
            free = [n for n in holders if self.active[n] < PER_PEER]
            if not free:
                continue
            count = len(holders) + (key in sent)
            if best_count is None or count < best_count:
                best, best_count = [(key, free)], count
            elif count == best_count:
                best.append((key, free))
        if not best:
            return None
        best = [choice for choice in best if self.mine(choice[0])] or best
        key, free = random.choice(best)
        low = min(self.active[n] for n in free)
        return key, random.choice([n for n in free if self.active[n] == low])

    def work(self) -> None:
        while True:
            with self.cond:
                while True:
                    if self.failure is not None or not self.todo:
                        return
                    chosen = self.choose()
                    if chosen:
                        break
                    self.failure = self.failure or self.hopeless()
                    self.cond.wait(POLL_S)
                key, name = chosen
                self.inflight.add(key)
                self.active[name] += 1
            try:
                self.fetch(name, *key)
            except Exception as error:  # noqa: BLE001 (one failure ends the copy with its line)
                with self.cond:
                    self.failure = self.failure or f"{type(error).__name__}: {error}"
                    self.failed_with = self.failed_with or error
            finally:
                with self.cond:
                    self.inflight.discard(key)
                    self.active[name] -= 1
                    self.cond.notify_all()

    def hopeless(self) -> str | None:
        """A piece no peer can send any more: every peer that holds its file whole sent bad bytes (asked nothing
        more) and no other has it. Named now, not at the stall deadline as if a source froze."""
        holders = {n for n, view in self.views.items() if "*" in view.values()} | set(self.banned)
        if not self.banned or holders - set(self.banned) or any(
                n not in self.views for n in self.peers if n not in self.banned):  # one not heard from yet
            return None
        for rel, index in sorted(self.todo - self.inflight):
            if not any(self.has(n, rel, index) for n in self.peers if n not in self.banned):
                bad = ", ".join(sorted(self.banned))
                return (f"every holder of {rel} sent bytes that fail its digests ({bad}): no good copy is left in "
                        f"the group; run with model_reverify=true on {bad} (--limit), then re-run")
        return None

    def fetch(self, name: str, rel: str, index: int) -> None:
        """Ask `name` for one piece; keep it only when its sha256 is the control node's."""
        size = self.files[rel]["size"]
        offset, length = piece_range(size, self.piece, index)
        buffer, got, digest = bytearray(length), 0, hashlib.sha256()
        view = memoryview(buffer)
        try:
            connection, response = self.request(name, "/" + urllib.parse.quote(rel),
                                                {"Range": f"bytes={offset}-{offset + length - 1}"})
            with contextlib.closing(connection):
                if response.status != 206:  # busy (503): a moment later; not (yet) held (404): next poll
                    response.read()
                    with self.cond:
                        if response.status == 503:
                            self.busy_until[name] = time.monotonic() + BUSY_S
                        else:
                            self.views.get(name, {}).pop(rel, None)
                    return
                while got < length:
                    if self.pace:
                        self.pace.wait(min(RECV, length - got))
                    n = response.readinto(view[got:got + RECV])
                    if not n:
                        break
                    digest.update(view[got:got + n])
                    got += n
                    self.moved(n)
        except (OSError, http.client.HTTPException):
            with self.cond:
                self.down(name)
            return
        if got != length:
            with self.cond:
                self.down(name)
            return
        expected, found = self.pieces[rel][index], digest.hexdigest()
        if found != expected:  # bad bytes: never written, never served, and that peer is asked nothing more
            with self.cond:
                self.banned[name] = rel
                self.refused.append({"peer": name, "file": rel, "piece": index, "expected": expected,
                                     "found": found})
            return
        os.pwrite(self.fds[rel], buffer, offset)
        with self.cond:
            self.received[name] += length
            self.have[rel][index] = ord("1")
            self.todo.discard((rel, index))
            self.left[rel] -= 1
            last = not self.left[rel]
        if last:
            self.finish(rel)
        else:
            self.write_have()

    def finish(self, rel: str) -> None:
        """Every piece in: the whole file checked against the control node's digest, then named."""
        os.close(self.fds.pop(rel))
        partial = self.partial[rel]
        wrong = self.verify(partial, self.files[rel])
        if wrong:
            self.tree.unlink(partial)
            with self.cond:
                seed = self.pieces_from
                self.failure = (f"{rel}: every piece matched the piece digests read from {seed}, but the whole file "
                                f"does not match the control node's (expected {wrong[0]}, found {wrong[1]}): the copy "
                                f"on {seed} is bad: run with model_reverify=true on {seed} (--limit {seed})")
            return
        self.tree.rename(partial, rel)
        with self.cond:
            self.complete.add(rel)
            if self.files[rel].get("sha256"):
                self.digests[rel] = self.files[rel]["sha256"]
        self.write_have()

    def run(self) -> dict:
        threading.Thread(target=self.poll, daemon=True).start()
        workers = [threading.Thread(target=self.work, daemon=True) for _ in range(WORKERS)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        for fd in self.fds.values():
            os.close(fd)
        if self.failure is None and self.todo:
            self.failure = "pieces left that no peer has"
        if self.failure is not None:
            for rel in self.have:
                if rel not in self.complete:
                    self.tree.unlink(self.partial[rel])
        return self.digests
