"""Checkpoints on the control node: a revision resolved once to a commit with every file's size and sha256
(from the hub's metadata, or from a mirror's manifest), and whether a host's copy is already complete."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, replace
from fnmatch import fnmatch
from pathlib import Path

from modelfleet.base import keys, runscope
from modelfleet.base.errors import ModelfleetError
from modelfleet.base.host_commands import MANIFEST
from modelfleet.plan.inventory.schema import COMMIT_RE

HUB_TIMEOUT_S = 120


class ModelSourceError(ModelfleetError, RuntimeError):
    pass


@dataclass(frozen=True)
class Snapshot:
    repo: str
    revision: str  # as the inventory gave it (branch, tag or commit)
    commit: str
    files: dict  # path -> {"size": int, "sha256": str | None, "blob_id": str | None}

    @property
    def total_bytes(self) -> int:
        return sum(f["size"] for f in self.files.values())

    def only(self, patterns: tuple[str, ...]) -> "Snapshot":
        """The same commit restricted to the files matching any of `patterns` (all of them when none)."""
        if not patterns:
            return self
        files = {path: meta for path, meta in self.files.items() if any(fnmatch(path, p) for p in patterns)}
        return replace(self, files=files)


class _SameOrigin(urllib.request.HTTPRedirectHandler):
    """A redirect keeps the hub token only while it stays on the endpoint's scheme, host and port (a renamed
    repository answers with one, as huggingface_hub follows it); anywhere else it is dropped."""

    def __init__(self, origin: tuple[str, str], token: str | None):
        self.origin, self.token = origin, token

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        target = urllib.parse.urlsplit(newurl)
        if new is not None and self.token and (target.scheme, target.netloc) == self.origin:
            new.add_unredirected_header("Authorization", f"Bearer {self.token}")
        return new


def _hub_metadata(request: dict) -> dict:
    """Commit and every file's size, LFS sha256 and git blob id, from the hub's API: the one request
    huggingface_hub's `model_info(files_metadata=True)` sends (GET /api/models/REPO/revision/REV?blobs=True;
    tests/unit/test_mirror.py holds the two answers equal), made with the standard library in this process:
    huggingface_hub's HTTP stack (httpx, anyio, trio where a user's environment has it) does not import under a
    pyinfra run's gevent patches, and a child interpreter for it was most of a no-op run's fixed CPU. The token
    goes only to the endpoint's own origin (a redirect elsewhere drops it), and never into an error."""
    token = request["token"]
    if token and token != token.strip():
        return {"error": "the hub token has spaces or a line break around it (check the variable hf_token_env "
                         "names)"}
    url = (f"{request['endpoint'].rstrip('/')}/api/models/{request['repo']}/revision/"
           f"{urllib.parse.quote(request['revision'], safe='')}?blobs=True")
    asked = urllib.request.Request(url, headers={"User-Agent": "modelfleet"})
    if token:
        asked.add_unredirected_header("Authorization", f"Bearer {token}")
    origin = urllib.parse.urlsplit(url)
    opener = urllib.request.build_opener(_SameOrigin((origin.scheme, origin.netloc), token))
    try:
        with opener.open(asked, timeout=HUB_TIMEOUT_S) as response:
            info = json.load(response)
    except urllib.error.HTTPError as error:  # the hub names its error (GatedRepo, RevisionNotFound) in headers
        code, message = error.headers.get("X-Error-Code", ""), error.headers.get("X-Error-Message", "")
        error.close()
        return {"error": f"HTTP {error.code} {code or error.reason}{': ' + message if message else ''} for {url}"}
    except (OSError, ValueError) as error:  # refused, unreachable, timed out, not JSON: one line for the operator
        reason = getattr(error, "reason", error)
        first = str(reason).splitlines()[0] if str(reason) else ""
        return {"error": f"hub unreachable: {type(reason).__name__}: {first}"}
    files = {s["rfilename"]: {"size": s.get("size"), "sha256": (s.get("lfs") or {}).get("sha256"),
                              "blob_id": s.get("blobId")} for s in info.get("siblings", [])}
    return {"commit": info["sha"], "files": files}


def _from_hub(repo: str, revision: str, endpoint: str, token: str | None) -> Snapshot:
    answer = _hub_metadata({"repo": repo, "revision": revision, "endpoint": endpoint, "token": token})
    if "error" in answer:
        raise ModelSourceError(f"{repo}@{revision} on {endpoint}: {answer['error']}")
    return Snapshot(repo=repo, revision=revision, commit=answer["commit"], files=answer["files"])


def _from_mirror(repo: str, revision: str, source: str) -> Snapshot:
    """An air-gapped mirror holds <repo>/<commit>/ as a modelfleet host does, manifest included."""
    if not COMMIT_RE.match(revision or ""):
        raise ModelSourceError(f"{repo}: model_source {source} needs `revision` pinned to a 40-hex commit "
                               f"(a mirror has no branches to resolve), got {revision!r}")
    url = f"{source.rstrip('/')}/{repo}/{revision}/{MANIFEST}"
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            manifest = json.load(response)
    except (OSError, ValueError) as error:
        raise ModelSourceError(f"{repo}@{revision}: no readable manifest at {url}: {error}") from error
    files = {path: {"size": e["size"], "sha256": e.get("sha256")} for path, e in manifest["files"].items()}
    return Snapshot(repo=repo, revision=revision, commit=revision, files=files)


def inside(rel: str) -> bool:
    """A listed file's path stays below the revision's folder (no `..`, not absolute)."""
    return bool(Path(rel).parts) and not Path(rel).is_absolute() and ".." not in Path(rel).parts


def snapshot(repo: str, revision: str | None, endpoint: str, token_env: str, source: str | None = None) -> Snapshot:
    """Resolve once per run (all hosts of a pool share the answer). A listing that names a file outside the
    revision's folder is refused: the hosts would write it wherever it points."""
    key = (repo, revision or "main", source or endpoint)
    known = runscope.slot("snapshots", dict)
    with runscope.lock("snapshots"):
        if key not in known:
            if source:
                snap = _from_mirror(repo, revision or "", source)
            else:
                snap = _from_hub(repo, revision or "main", endpoint, keys.from_env(token_env))
            outside = sorted(rel for rel in snap.files if not inside(rel))
            if outside:
                raise ModelSourceError(f"{repo}@{snap.commit[:12]} on {source or endpoint} lists files outside its "
                                       f"folder ({', '.join(outside[:3])}): refused")
            known[key] = snap
        return known[key]


def missing_files(tree: dict, snap: Snapshot, reverify: bool = False) -> list[str]:
    """
    Files of `snap` this host's copy lacks, judged by what a full check recorded in its manifest (size and
    mtime unchanged since). Everything, when asked to reverify.
    """
    manifest = tree.get("manifest") or {}
    if reverify or manifest.get("commit") != snap.commit:
        return sorted(snap.files)
    recorded, present = manifest.get("files", {}), tree.get("files", {})
    out = []
    for path, meta in snap.files.items():
        entry, seen = recorded.get(path), present.get(path)
        if not entry or not seen or seen[0] != meta["size"] or entry["size"] != meta["size"] \
                or abs(seen[1] - entry["mtime"]) > 1e-3:
            out.append(path)
    return sorted(out)
