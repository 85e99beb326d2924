"""Checkpoints on the control node: a revision resolved once to a commit with every file's size and sha256
(from the hub's metadata, or from a mirror's manifest), and whether a host's copy is already complete."""

from __future__ import annotations

import json
import subprocess
import sys
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


def _hub_metadata(request: dict) -> dict:
    """Runs in the child: commit and every file's size, LFS sha256 and git blob id, from the hub's API."""
    # huggingface_hub (slow to import, and not under pyinfra's gevent patches) loads only in the child
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    try:
        info = HfApi(endpoint=request["endpoint"], token=request["token"] or False).model_info(
            request["repo"], revision=request["revision"], files_metadata=True)
    except HfHubHTTPError as error:
        return {"error": f"{type(error).__name__}: {str(error).splitlines()[0]}"}
    except Exception as error:  # refused, unreachable, timed out: one line for the operator, not a traceback
        return {"error": f"hub unreachable: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"}
    files = {s.rfilename: {"size": s.size, "sha256": s.lfs.sha256 if s.lfs else None, "blob_id": s.blob_id}
             for s in info.siblings}
    return {"commit": info.sha, "files": files}


def _from_hub(repo: str, revision: str, endpoint: str, token: str | None) -> Snapshot:
    """
    Asked from a child interpreter: huggingface_hub's HTTP stack (httpx, anyio, and trio where a user's
    environment has it) does not import under the gevent patches of a pyinfra run. The token travels on the
    child's stdin, never in its argv.
    """
    request = {"repo": repo, "revision": revision, "endpoint": endpoint, "token": token}
    try:
        run = subprocess.run([sys.executable, "-m", "modelfleet.plan.checkpoint"], input=json.dumps(request),
                             capture_output=True, text=True, timeout=HUB_TIMEOUT_S)
        answer = json.loads(run.stdout) if run.returncode == 0 else {"error": run.stderr.strip()[-300:]}
    except (subprocess.TimeoutExpired, ValueError) as error:
        answer = {"error": f"{type(error).__name__}: {error}"}
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


if __name__ == "__main__":  # the child of _from_hub: one JSON request on stdin, one JSON answer on stdout
    json.dump(_hub_metadata(json.load(sys.stdin)), sys.stdout)
