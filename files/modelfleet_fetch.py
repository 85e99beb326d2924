#!/usr/bin/env python3
"""Put one checkpoint revision on this host, complete and verified (run by modelfleet's model stage).

    modelfleet_fetch.py JOB.json hub            download from the hub (huggingface_hub, in the stage's venv)
    modelfleet_fetch.py JOB.json peer URL       copy from a pool peer that already holds verified files (HTTP)
    modelfleet_fetch.py JOB.json verify         verify only
    ... [--reverify]                            hash every file, even those the manifest vouches for
    modelfleet_fetch.py serve DIR ADDRESS PORT  serve a verified copy to peers (read-only, sendfile)

JOB.json (written by the control node): repo, commit, endpoint, dest, token_file, and the hub's metadata for
every file: {path: {size, sha256 (LFS files) | null}}. A file counts as verified when its size matches and its
sha256 matches the hub's (LFS) — or, on a re-run, when size and mtime equal what the manifest recorded after a
full check. Missing or corrupt files are (re)fetched; completed files are never fetched again. The result goes
to DEST/.modelfleet-manifest.json and, as JSON, to stdout. The token is read from its 0600 file, never argv.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MANIFEST = ".modelfleet-manifest.json"
CHUNK = 4 << 20
WORKERS = 8


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
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
        digest = (streamed or {}).get(rel) or (sha256_of(path) if meta.get("sha256") or reverify else None)
        if meta.get("sha256") and digest != meta["sha256"]:
            return rel, None
        return rel, {"size": st.st_size, "mtime": st.st_mtime, "sha256": digest or known and known.get("sha256")}

    with ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(one, files.items()))
    return {rel: entry for rel, entry in results if entry}, [rel for rel, entry in results if not entry]


def fetch_from_hub(job: dict, paths: list[str]) -> None:
    from huggingface_hub import snapshot_download

    token_file = job.get("token_file")
    token = Path(token_file).read_text().strip() if token_file and Path(token_file).exists() else False
    for rel in paths:  # a corrupt file must go before huggingface_hub would trust it as complete
        (Path(job["dest"]) / rel).unlink(missing_ok=True)
    snapshot_download(job["repo"], revision=job["commit"], local_dir=job["dest"], endpoint=job["endpoint"],
                      token=token, allow_patterns=paths, max_workers=WORKERS)


def fetch_from_peer(job: dict, paths: list[str], base_url: str) -> dict:
    """Copy each file, hashing while it streams; returns {path: sha256} so no second read is needed."""
    dest = Path(job["dest"])

    def one(rel):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.modelfleet-partial")
        digest = hashlib.sha256()
        with urllib.request.urlopen(f"{base_url.rstrip('/')}/{rel}", timeout=60) as response, partial.open("wb") as f:
            for block in iter(lambda: response.read(CHUNK), b""):
                f.write(block)
                digest.update(block)
        partial.replace(target)
        return rel, digest.hexdigest()

    with ThreadPoolExecutor(WORKERS) as pool:
        return dict(pool.map(one, paths))


def serve(directory: str, address: str, port: int) -> None:
    """Read-only HTTP for the group's peers: files go out with sendfile(2), no copy through Python."""
    import functools
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Handler(SimpleHTTPRequestHandler):
        def copyfile(self, source, outputfile):
            self.connection.sendfile(source)

        def log_message(self, fmt, *args):
            pass

    ThreadingHTTPServer((address, port), functools.partial(Handler, directory=directory)).serve_forever()


def main(argv: list[str]) -> int:
    if argv[0] == "serve":
        serve(argv[1], argv[2], int(argv[3]))
        return 0
    job = json.loads(Path(argv[0]).read_text())
    mode, reverify = argv[1], "--reverify" in argv
    dest = Path(job["dest"])
    dest.mkdir(parents=True, exist_ok=True)
    manifest_path = dest / MANIFEST
    manifest = json.loads(manifest_path.read_text()).get("files", {}) if manifest_path.exists() else {}
    files = job["files"]
    start = time.monotonic()
    verified, missing = check(dest, files, manifest, reverify)
    report = {"commit": job["commit"], "dest": str(dest), "files": len(files), "fetched": [], "bytes_fetched": 0}
    if missing and mode != "verify":
        streamed = fetch_from_hub(job, missing) if mode == "hub" else fetch_from_peer(job, missing, argv[2])
        report["fetched"] = missing
        report["bytes_fetched"] = sum(files[rel]["size"] for rel in missing)
        again, still = check(dest, {rel: files[rel] for rel in missing}, {}, True, streamed or {})
        verified.update(again)
        missing = still
    report.update(ok=not missing, missing_or_corrupt=missing, seconds=round(time.monotonic() - start, 3))
    if not missing:
        manifest_path.write_text(json.dumps({"repo": job["repo"], "commit": job["commit"], "files": verified,
                                             "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                                            indent=1) + "\n")
    print(json.dumps(report))
    if missing:
        print(f"modelfleet: {len(missing)} file(s) missing or corrupt after fetching: {', '.join(missing[:5])}",
              file=sys.stderr)
    return 0 if not missing else 1


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main(sys.argv[1:]))
