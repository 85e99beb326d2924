"""Air-gapped sites: the checkpoint mirror that `model_source` reads, built by `modelfleet mirror` (the preview of
every outside URL a run uses, `modelfleet urls`, is modelfleet/fleet/urls.py).

The mirror's layout (what checkpoint.snapshot and the model stage read through `model_source`):

    DEST/<hub repo>/<commit>/<path>                         each file of the checkpoint, as on the hub
    DEST/<hub repo>/<commit>/.modelfleet-manifest.json      {"repo", "commit", "files": {path: {"size",
                                                             "sha256", "blob_id" (non-LFS files), "mtime"}},
                                                             "source", "verified_at"}

Every file in the manifest has its sha256, so a host fetching from the mirror verifies every byte. A file
enters DEST only once verified (downloaded under a temporary folder, renamed into place), and the manifest is
written last, by rename, once the revision is complete: a host never reads a half-written mirror. A re-run
copies nothing already verified (the manifest's size and mtime vouch for a file, as on a host).

Files come from the hub (huggingface_hub at the resolved commit, the inventory's `hf_endpoint` and the token
its `hf_token_env` names) and are checked against the hub's sha256 (LFS) or git blob id; or from a host of
the inventory that already holds the revision (SFTP over the inventory's SSH settings), checked against that
host's own manifest, which its fetch wrote after checking every file against its source. Verification is the
fetch script's own (files/modelfleet_fetch.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Callable

from modelfleet import FILES_DIR
from modelfleet.base import keys
from modelfleet.base.errors import ModelfleetError
from modelfleet.host import ssh
from modelfleet.plan.checkpoint import MANIFEST, ModelSourceError, inside, snapshot
from modelfleet.plan.inventory.plan import Resolved
from modelfleet.plan.inventory.schema import COMMIT_RE

LOCK = ".modelfleet-mirror-lock"
STAGING = ".modelfleet-mirror-staging-"  # + pid: a run's temporary folder, removed when the run ends


def _fetch_module():
    """The fetch script the hosts run, loaded as a module: the mirror verifies exactly as a host does."""
    spec = importlib.util.spec_from_file_location("modelfleet_fetch", FILES_DIR / "modelfleet_fetch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fetch = _fetch_module()


class MirrorError(ModelfleetError):
    """A failure, as one line saying what failed and what to do."""


@dataclass
class Wanted:
    """One revision the inventory's hosts serve, and which of its files they need."""

    repo: str
    revision: str
    patterns: tuple[str, ...] | None  # None: every file of the revision
    hosts: list[str] = field(default_factory=list)
    model_ids: list[str] = field(default_factory=list)  # catalog ids: a host holds it at model_root/<id>/<commit>
    endpoint: str = ""
    token_env: str = ""

    def needs(self, path: str) -> bool:
        return self.patterns is None or any(fnmatch(path, p) for p in self.patterns)


def wanted(result: Resolved, names: list[str]) -> list[Wanted]:
    """Every (repository, revision) the named hosts serve, in inventory order, with the union of the files
    their services need (a GGUF service needs only its quantization)."""
    out: dict[tuple[str, str], Wanted] = {}
    for name in names:
        plan = result.hosts[name]
        for svc in plan.services:
            key = (svc.hf_repo, svc.revision or "main")
            want = out.setdefault(key, Wanted(repo=key[0], revision=key[1], patterns=(), endpoint=plan.hf_endpoint,
                                              token_env=plan.hf_token_env))
            if not svc.checkpoint_patterns:
                want.patterns = None
            elif want.patterns is not None:
                want.patterns = tuple(dict.fromkeys(want.patterns + svc.checkpoint_patterns))
            want.hosts += [name] if name not in want.hosts else []
            want.model_ids += [svc.model.id] if svc.model.id not in want.model_ids else []
    return list(out.values())


# --- sources ----------------------------------------------------------------------------------------------------

class HubSource:
    """The hub (or the lab's double) at `hf_endpoint`, with the token the inventory names."""

    def __init__(self):
        self.name = "hub"

    def listing(self, want: Wanted) -> tuple[str, dict]:
        try:
            snap = snapshot(want.repo, want.revision, want.endpoint, want.token_env, None)
        except ModelSourceError as error:
            raise MirrorError(f"{error}; check hf_endpoint and {want.token_env}") from None
        return snap.commit, {p: m for p, m in snap.files.items() if want.needs(p)}

    def describe(self, want: Wanted) -> str:
        return want.endpoint

    def copy(self, want: Wanted, commit: str, rel: str, staging: Path) -> None:
        """The file, at staging/rel."""
        # huggingface_hub (slow to import) loads only when the hub is the source
        from huggingface_hub import hf_hub_download

        token = keys.from_env(want.token_env) or False
        try:
            got = hf_hub_download(want.repo, rel, revision=commit, endpoint=want.endpoint, token=token,
                                  local_dir=str(staging))
        except Exception as error:  # huggingface_hub's errors share no base we can name here
            raise MirrorError(f"the hub ({want.endpoint}) failed on {want.repo}@{commit[:12]}/{rel}: "
                              f"{fetch.one_line(error)}; files already verified are kept, re-run when it "
                              "answers") from None
        if Path(got).resolve() != (staging / rel).resolve():  # pragma: no cover - local_dir puts it there
            shutil.move(got, staging / rel)

    def close(self) -> None:
        pass


class HostSource:
    """A host of the inventory that holds the revision, verified: its model_root/<model id>/<commit>/, read over
    SFTP with the inventory's SSH settings (host keys checked as `status` checks them)."""

    def __init__(self, result: Resolved, name: str):
        if name not in result.hosts:
            raise MirrorError(f"--from-host {name}: no such host in the inventory")
        self.plan = result.hosts[name]
        self.name = f"host {name}"
        self.conn = ssh.connect(self.plan)
        try:
            ssh.open_checked(self.conn, self.plan)
            self.sftp = self.conn.sftp()
        except Exception as error:
            self.conn.close()
            raise MirrorError(f"--from-host {name}: cannot reach it over SSH: {fetch.one_line(error)}") from None
        self.dirs: dict[tuple[str, str], str] = {}

    def listing(self, want: Wanted) -> tuple[str, dict]:
        if not COMMIT_RE.match(want.revision):
            raise MirrorError(f"{want.repo}: --from-host needs `revision` pinned to a 40-hex commit (a host holds "
                              f"commits, not branches), got {want.revision!r}")
        root = self.plan.model_root.rstrip("/")
        tried = []
        for model_id in want.model_ids:
            folder = f"{root}/{model_id}/{want.revision}"
            tried.append(folder)
            try:
                with self.sftp.open(f"{folder}/{MANIFEST}", "r") as f:
                    manifest = json.loads(f.read())
            except (OSError, ValueError):
                continue
            if manifest.get("commit") != want.revision or manifest.get("repo") not in (None, want.repo):
                continue
            self.dirs[(want.repo, want.revision)] = folder
            files = {p: {"size": e["size"], "sha256": e.get("sha256"), "blob_id": e.get("blob_id")}
                     for p, e in manifest.get("files", {}).items() if want.needs(p)}
            return want.revision, files
        raise MirrorError(f"{self.plan.name} holds no verified copy of {want.repo}@{want.revision[:12]} (no "
                          f"manifest in {' or '.join(tried)}): converge it first, or mirror from the hub")

    def describe(self, want: Wanted) -> str:
        return f"{self.plan.name}:{self.dirs.get((want.repo, want.revision), '?')}"

    def copy(self, want: Wanted, commit: str, rel: str, staging: Path) -> None:
        remote = f"{self.dirs[(want.repo, commit)]}/{rel}"
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        try:
            self.sftp.get(remote, str(staging / rel))  # paramiko prefetches: the link's bandwidth, not its RTT
        except (OSError, EOFError) as error:
            raise MirrorError(f"{self.plan.name} stopped during the copy of {remote}: {fetch.one_line(error)}; "
                              "files already verified are kept, re-run") from None

    def close(self) -> None:
        self.conn.close()


# --- the mirror -------------------------------------------------------------------------------------------------

def _locked(dest: Path):
    try:
        return fetch.locked(dest, LOCK, "`modelfleet mirror`")
    except fetch.FetchError as error:
        raise MirrorError(str(error)) from None


def _sweep(dest: Path) -> list[str]:
    """Temporary folders of runs that died (this run holds the lock, so none of them is alive)."""
    gone = []
    for folder in dest.glob(f"{STAGING}*"):
        shutil.rmtree(folder, ignore_errors=True)
        gone.append(folder.name)
    return gone


def _read_manifest(folder: Path) -> dict:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        return manifest if isinstance(manifest, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_manifest(folder: Path, manifest: dict) -> None:
    temp = folder / f".{MANIFEST}.{os.getpid()}.tmp"
    temp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    os.chmod(temp, 0o644)
    temp.replace(folder / MANIFEST)


def _with_sha256(folder: Path, rel: str, entry: dict) -> dict:
    """A verified entry with its sha256 (files checked by git blob id get one: hosts then check every byte)."""
    if entry.get("sha256"):
        return entry
    return {**entry, "sha256": fetch.sha256_of(folder / rel)}


def _copy(want: Wanted, commit: str, files: dict[str, dict], source, target: Path, staging: Path,
          verified: dict[str, dict], label: str, log: Callable[[str], None]) -> list[str]:
    """Copy `files` from `source` into `staging`, check each as a host would, and move each good one into
    `target` (adding it to `verified`); the files that did not match, which stay out."""
    staging.mkdir(parents=True, exist_ok=True)
    failed: list[str] = []
    done = [0]
    counted = threading.Lock()

    def one(rel: str) -> None:
        source.copy(want, commit, rel, staging)
        good, bad = fetch.check(staging, {rel: files[rel]}, {}, True)
        if bad:
            (staging / rel).unlink(missing_ok=True)
            failed.append(rel)
            log(f"mirror: {label}: {rel} does not match {source.name}'s size and checksum: not kept")
            return
        final = target / rel
        final.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(staging / rel, 0o644)
        (staging / rel).replace(final)
        st = final.stat()
        verified[rel] = _with_sha256(target, rel, {**good[rel], "size": st.st_size, "mtime": st.st_mtime})
        with counted:
            done[0] += 1
            count = done[0]
        log(f"mirror: {label}: {rel} ({files[rel]['size'] / 1e6:.1f} MB) verified [{count}/{len(files)}]")

    workers = fetch.WORKERS if isinstance(source, HubSource) else 1  # one SFTP channel: prefetch fills it
    with ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(one, rel) for rel in files]
        try:
            for future in futures:
                future.result()
        except BaseException:
            for future in futures:
                future.cancel()  # the copies under way finish (and are verified); no new one starts
            raise
    return failed


def _one(want: Wanted, dest: Path, source, staging_root: Path, log: Callable[[str], None]) -> dict:
    commit, files = source.listing(want)
    outside = sorted(rel for rel in files if not inside(rel))
    if outside:
        raise MirrorError(f"{want.repo}@{commit[:12]} on {source.describe(want)} lists files outside its folder "
                          f"({', '.join(outside[:3])}): refused, nothing of it written")
    if not files:
        raise MirrorError(f"{want.repo}@{commit[:12]} on {source.describe(want)} has no file the services need "
                          f"({', '.join(want.patterns or ())})")
    label = f"{want.repo}@{commit[:12]}"
    target = dest / want.repo / commit
    target.mkdir(parents=True, exist_ok=True)
    for temp in target.glob(f".{MANIFEST}.*.tmp"):  # a manifest a run that died did not get to rename
        temp.unlink(missing_ok=True)
    old = _read_manifest(target)
    recorded = old.get("files", {}) if old.get("commit") == commit else {}
    verified, missing = fetch.check(target, files, recorded, False)
    # Files an earlier run mirrored for other services of this commit stay listed while they are unchanged.
    kept = {p: e for p, e in recorded.items() if p not in files and (target / p).is_file()
            and (target / p).stat().st_size == e.get("size") and (target / p).stat().st_mtime == e.get("mtime")}
    size = sum(files[p]["size"] for p in missing)
    log(f"mirror: {label}: {len(files)} file(s), {len(files) - len(missing)} already verified, {len(missing)} to "
        f"copy ({size / 1e6:.1f} MB) from {source.name} ({source.describe(want)})")
    failed = _copy(want, commit, {rel: files[rel] for rel in missing}, source, target,
                   staging_root / want.repo / commit, verified, label, log)
    if failed:
        raise MirrorError(f"refused {label}: {len(failed)} file(s) do not match {source.name}'s size and checksum "
                          f"({', '.join(sorted(failed)[:5])}); the manifest is not written, so no host takes this "
                          "revision from the mirror; check the source and re-run")
    entries = {**kept, **{p: _with_sha256(target, p, {k: v for k, v in e.items() if v is not None})
                          for p, e in verified.items()}}
    if entries != recorded or old.get("repo") != want.repo:
        _write_manifest(target, {"repo": want.repo, "commit": commit, "files": entries,
                                 "source": f"{source.name} {source.describe(want)}",
                                 "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    log(f"mirror: {label}: complete in {target}")
    return {"repo": want.repo, "revision": want.revision, "commit": commit, "path": str(target),
            "files": len(files), "bytes": sum(m["size"] for m in files.values()), "copied": len(missing),
            "bytes_copied": size, "already_verified": len(files) - len(missing), "hosts": want.hosts}


def build(result: Resolved, names: list[str], dest: Path, from_host: str | None = None,
          log: Callable[[str], None] = lambda line: None) -> dict:
    """Mirror every revision the named hosts serve into `dest`; the summary (JSON-ready). Raises MirrorError."""
    wants = wanted(result, names)
    if not wants:
        raise MirrorError("the selected hosts serve no model: nothing to mirror")
    dest = dest.resolve()
    dest.mkdir(parents=True, exist_ok=True)
    lock = _locked(dest)
    staging_root = dest / f"{STAGING}{os.getpid()}"
    source = None
    try:
        for name in _sweep(dest):
            log(f"mirror: removed {name}, left by a run that did not finish")
        source = HostSource(result, from_host) if from_host else HubSource()
        staging_root.mkdir()
        revisions = [_one(want, dest, source, staging_root, log) for want in wants]
    finally:
        shutil.rmtree(staging_root, ignore_errors=True)
        if source:
            source.close()
        lock.close()
    pins = [r for r in revisions if r["revision"] != r["commit"]]
    return {"ok": True, "dest": str(dest), "model_source": dest.as_uri(),
            "source": source.name, "revisions": revisions,
            "copied": sum(r["copied"] for r in revisions), "bytes_copied": sum(r["bytes_copied"] for r in revisions),
            "notes": [f"{r['repo']}: pin revision = \"{r['commit']}\" (was {r['revision']!r}): model_source "
                      "needs commits" for r in pins]}
