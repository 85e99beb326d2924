#!/usr/bin/env python3
"""Hugging Face hub double for the lab: serves generated checkpoints through the endpoints huggingface_hub uses.

    /api/models/{repo}/revision/{rev}      repo_info (siblings; with ?blobs=true, sizes and LFS sha256)
    /api/models/{repo}/tree/{rev}[/{dir}]  list_repo_tree (oid, size, lfs {oid, size}), as snapshot_download lists
    HEAD|GET /{repo}/resolve/{rev}/{path}   hf_hub_download: X-Repo-Commit, ETag, Range requests (206)
    GET /_lab/stats, POST /_lab/reset      bytes served (per repo, per file, per client address), for the tests
    POST /_lab/freeze?after=N              a frozen hub: every file body stops after N bytes and the connection
                                           stays open, sending nothing, until /_lab/reset
    --scenario FILE                        a hub that answers badly, as the lab's scenario file has it (read at
                                           each request): hub_status (e.g. 429 or 503, with hub_retry_after as
                                           Retry-After), hub_cut_after (a body cut after N bytes, the connection
                                           closed), hub_swap (another revision's bytes under the asked one's
                                           names), each for a file's first hub_fault_times requests (0: all)

Errors carry the hub's X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo) so the real
client raises its real exceptions. With --token-file, every request needs `Authorization: Bearer <token>`
(a gated repository). Stdlib only. Checkpoints are generated once into --data (see generate()): real
safetensors shards, their index, config, generation config and tokenizer files, one commit per revision.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf")
CHUNK = 1 << 20


def _safetensors(tensors: dict[str, tuple[list[int], bytes]]) -> bytes:
    """A valid safetensors file: u64 header length, JSON header, then the raw BF16 bytes."""
    header, offset = {}, 0
    for name, (shape, data) in tensors.items():
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"".join(data for _, data in tensors.values())


def _noise(seed: str, size: int) -> bytes:
    out, counter = bytearray(), 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}/{counter}".encode()).digest() * 128
        counter += 1
    return bytes(out[:size])


def generate(root: Path, repo: str, revision: str, shards: int, shard_mib: float) -> None:
    """One commit of `repo`: `shards` safetensors files of about `shard_mib` MiB, index, config, tokenizer."""
    folder = root / "files" / repo / revision
    if (folder / "model.safetensors.index.json").exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    hidden = 256
    rows = max(1, int(shard_mib * (1 << 20)) // (hidden * 2))
    weight_map, total = {}, 0
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        tensor = f"model.layers.{i - 1}.mlp.weight"
        data = _noise(f"{repo}@{revision}/{name}", rows * hidden * 2)
        (folder / name).write_bytes(_safetensors({tensor: ([rows, hidden], data)}))
        weight_map[tensor] = name
        total += len(data)
    files = {
        "model.safetensors.index.json": {"metadata": {"total_size": total}, "weight_map": weight_map},
        "config.json": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
                        "num_hidden_layers": shards, "torch_dtype": "bfloat16", "modelfleet_revision": revision},
        "generation_config.json": {"temperature": 1.0, "top_p": 0.95},
        "tokenizer.json": {"version": "1.0", "model": {"type": "BPE", "vocab": {"<s>": 0, "</s>": 1}, "merges": []}},
        "tokenizer_config.json": {"bos_token": "<s>", "eos_token": "</s>", "chat_template": "{{ messages }}"},
    }
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content, indent=2) + "\n")


def git_blob_oid(data_path: Path) -> str:
    size = data_path.stat().st_size
    digest = hashlib.sha1(f"blob {size}\0".encode())
    with data_path.open("rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


class Hub:
    """Repos → refs → commits → file metadata (computed once at start)."""

    def __init__(self, root: Path, token: str | None):
        self.root, self.token = root, token
        self.lock = threading.Lock()
        self.refs: dict[str, dict[str, str]] = {}       # repo -> ref (branch, tag or commit) -> commit
        self.commits: dict[str, dict[str, dict]] = {}   # commit -> path -> {size, oid, sha256?, file}
        self.stats: dict = {}
        self.frozen_after: int | None = None  # the freeze fault: bytes of a body sent before it stops
        self.scenario: Path | None = None  # the lab's scenario file: its hub_* fault switches
        self.faulted: dict[str, int] = {}  # file -> requests it got a fault for (per scenario file version)
        self.faults_of: float | None = None
        self.reset()
        for revision_dir in sorted((root / "files").glob("*/*/*")):
            repo = f"{revision_dir.parent.parent.name}/{revision_dir.parent.name}"
            self.add_commit(repo, revision_dir)

    def add_commit(self, repo: str, folder: Path) -> None:
        entries, tree = {}, hashlib.sha1()
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            rel = path.relative_to(folder).as_posix()
            entry = {"size": path.stat().st_size, "oid": git_blob_oid(path), "file": path}
            if rel.endswith(LFS_SUFFIXES):
                sha = hashlib.sha256()
                with path.open("rb") as f:
                    for block in iter(lambda: f.read(CHUNK), b""):
                        sha.update(block)
                entry["sha256"] = sha.hexdigest()
            entries[rel] = entry
            tree.update(f"{rel} {entry['oid']}\n".encode())
        commit = tree.hexdigest()
        self.commits[commit] = entries
        refs = self.refs.setdefault(repo, {})
        refs[commit] = commit
        refs[folder.name] = commit  # the folder's name is a branch or tag: "main", "v1.0", ...

    def reset(self) -> None:
        with self.lock:
            self.stats = {"bytes_served": 0, "requests": 0, "by_repo": {}, "by_file": {}, "by_client": {}}
            self.frozen_after = None
            self.faulted = {}

    def fault(self, key: str) -> dict:
        """The scenario's hub faults for this request of `key` (a file), counted; {} when none applies."""
        try:
            mtime = self.scenario.stat().st_mtime if self.scenario else None
            fields = json.loads(self.scenario.read_text()) if mtime else {}
        except (OSError, ValueError):
            mtime, fields = None, {}
        faults = {k: v for k, v in fields.items()
                  if k in ("hub_status", "hub_cut_after", "hub_swap") and v is not None}
        with self.lock:
            if mtime != self.faults_of:  # a new scenario: its faults count from zero
                self.faults_of, self.faulted = mtime, {}
            if not faults:
                return {}
            times = fields.get("hub_fault_times") or 0
            done = self.faulted.get(key, 0)
            if times and done >= times:
                return {}
            self.faulted[key] = done + 1
            self.stats.setdefault("faults", {})[key] = done + 1
            self.stats.setdefault("first_fault_at", time.time())  # for the tests' fault-to-line figures
        return {**faults, "retry_after": fields.get("hub_retry_after")}

    def count(self, repo: str, path: str, client: str, nbytes: int) -> None:
        with self.lock:
            s = self.stats
            s["bytes_served"] += nbytes
            for key, name in (("by_repo", repo), ("by_file", f"{repo}/{path}"), ("by_client", client)):
                s[key][name] = s[key].get(name, 0) + nbytes


class Handler(BaseHTTPRequestHandler):
    hub: Hub
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet: the tests read /_lab/stats instead
        pass

    def _send_json(self, status: int, body, headers: dict | None = None) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(raw)

    def _error(self, status: int, code: str, message: str) -> None:
        self._send_json(status, {"error": message}, {"X-Error-Code": code, "X-Error-Message": message})

    def _authorized(self) -> bool:
        if self.hub.token is None or self.headers.get("Authorization") == f"Bearer {self.hub.token}":
            return True
        self._error(401, "GatedRepo", "Access to this repository is restricted: a valid token is required.")
        return False

    def _resolve(self, repo: str, revision: str) -> dict | None:
        refs = self.hub.refs.get(repo)
        if refs is None:
            self._error(404, "RepoNotFound", f"Repository {repo} not found")
            return None
        commit = refs.get(unquote(revision))
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return {"commit": commit, "files": self.hub.commits[commit]}

    def do_POST(self):
        if self.path == "/_lab/reset":
            self.hub.reset()
            return self._send_json(200, {"reset": True})
        if self.path.startswith("/_lab/freeze"):
            self.hub.frozen_after = int(parse_qs(urlparse(self.path).query).get("after", ["0"])[0])
            return self._send_json(200, {"frozen_after": self.hub.frozen_after})
        self._error(404, "EntryNotFound", "not found")

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        url = urlparse(self.path)
        query = parse_qs(url.query)
        if url.path == "/_lab/stats":
            with self.hub.lock:
                return self._send_json(200, self.hub.stats)
        if not self._authorized():
            return
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", url.path)
        if m:
            return self._repo_info(m.group(1), m.group(2), query.get("blobs", ["false"])[0].lower() == "true")
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(/.*)?", url.path)
        if m:
            return self._tree(m.group(1), m.group(2), unquote((m.group(3) or "/")[1:]),
                              query.get("recursive", ["false"])[0].lower() == "true")
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", url.path)
        if m:
            return self._file(m.group(1), m.group(2), unquote(m.group(3)))
        self._error(404, "EntryNotFound", f"no route for {url.path}")

    def _repo_info(self, repo: str, revision: str, blobs: bool) -> None:
        found = self._resolve(repo, revision)
        if not found:
            return
        siblings = []
        for path, entry in found["files"].items():
            sibling = {"rfilename": path}
            if blobs:
                sibling.update(size=entry["size"], blobId=entry["oid"])
                if "sha256" in entry:
                    sibling["lfs"] = {"sha256": entry["sha256"], "size": entry["size"], "pointerSize": 134}
            siblings.append(sibling)
        self._send_json(200, {"id": repo, "modelId": repo, "sha": found["commit"], "private": False,
                              "gated": "manual" if self.hub.token else False, "disabled": False, "tags": [],
                              "siblings": siblings, "lastModified": "2026-12-01T00:00:00.000Z"})

    def _tree(self, repo: str, revision: str, directory: str, recursive: bool) -> None:
        found = self._resolve(repo, revision)
        if not found:
            return
        prefix = f"{directory.rstrip('/')}/" if directory else ""
        out, folders = [], set()
        for path, entry in found["files"].items():
            if not path.startswith(prefix):
                continue
            rest = path[len(prefix):]
            if "/" in rest and not recursive:
                folders.add(prefix + rest.split("/", 1)[0])
                continue
            item = {"type": "file", "oid": entry["oid"], "size": entry["size"], "path": path}
            if "sha256" in entry:
                item["lfs"] = {"oid": entry["sha256"], "size": entry["size"], "pointerSize": 134}
            out.append(item)
        out += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": f} for f in sorted(folders)]
        self._send_json(200, out)

    def _file(self, repo: str, revision: str, path: str) -> None:
        found = self._resolve(repo, revision)
        if not found:
            return
        entry = found["files"].get(path)
        if entry is None:
            return self._error(404, "EntryNotFound", f"{path} does not exist at {revision}")
        fault = self.hub.fault(f"{repo}/{path}") if self.command == "GET" else {}
        if fault.get("hub_status"):  # a hub or mirror that asks the client to come back later (or just fails)
            code = fault["hub_status"]
            raw = json.dumps({"error": f"lab fault: {code}"}).encode()
            self.send_response(code)
            if fault.get("retry_after") is not None:
                self.send_header("Retry-After", str(fault["retry_after"]))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
            return
        if fault.get("hub_swap"):  # the same name, another revision's bytes: only a digest tells them apart
            other = self.hub.commits.get(self.hub.refs[repo].get(fault["hub_swap"], ""), {}).get(path)
            if other and other["size"] == entry["size"]:
                entry = other
        cut = fault.get("hub_cut_after")
        size, start, end = entry["size"], 0, entry["size"] - 1
        status = 200
        wanted = self.headers.get("Range")
        if wanted and self.command == "GET":
            m = re.fullmatch(r"bytes=(\d*)-(\d*)", wanted.strip())
            if not m or (not m.group(1) and not m.group(2)):
                return self._error(416, "RangeNotSatisfiable", f"bad range {wanted}")
            if m.group(1):
                start = int(m.group(1))
                end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            else:
                start = max(0, size - int(m.group(2)))
            if start >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        self.send_response(status)
        etag = entry.get("sha256") or entry["oid"]
        self.send_header("ETag", f'"{etag}"')
        self.send_header("X-Repo-Commit", found["commit"])
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if self.command == "HEAD":
            return
        sent = 0
        with entry["file"].open("rb") as f:
            f.seek(start)
            remaining = end - start + 1
            try:
                while remaining:
                    if cut is not None and sent >= cut:  # a cut body: the connection closes short of its length
                        self.close_connection = True
                        break
                    while self.hub.frozen_after is not None and sent >= self.hub.frozen_after:
                        time.sleep(0.2)  # frozen, not down: the connection stays open and silent
                    limit = remaining if self.hub.frozen_after is None else self.hub.frozen_after - sent
                    limit = limit if cut is None else min(limit, cut - sent)
                    block = f.read(min(CHUNK, remaining, max(limit, 1)))
                    self.wfile.write(block)
                    sent += len(block)
                    remaining -= len(block)
            finally:
                self.hub.count(repo, path, self.client_address[0], sent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--listen", default="127.0.0.1:5070")
    parser.add_argument("--token-file", type=Path)
    parser.add_argument("--scenario", type=Path, help="the lab's scenario file: its hub_* faults")
    parser.add_argument("--repo", action="append", default=[],
                        help="REPO=REV[,REV...]:SHARDS:SHARD_MIB, generated once into --data")
    parser.add_argument("--extra-file", action="append", default=[],
                        help="NAME=PATH: a file every generated revision also holds (the lab's GGUF)")
    args = parser.parse_args()
    extras = dict(item.split("=", 1) for item in args.extra_file)
    for spec in args.repo:
        repo, _, rest = spec.partition("=")
        revisions, shards, shard_mib = rest.split(":")
        for revision in revisions.split(","):
            generate(args.data, repo, revision, int(shards), float(shard_mib))
            for name, source in extras.items():
                target = args.data / "files" / repo / revision / name
                if not target.exists():
                    shutil.copyfile(source, target)
    token = args.token_file.read_text().strip() if args.token_file else None
    Handler.hub = Hub(args.data, token)
    Handler.hub.scenario = args.scenario
    host, port = args.listen.rsplit(":", 1)
    ThreadingHTTPServer((host, int(port)), Handler).serve_forever()


if __name__ == "__main__":
    main()
