"""`modelfleet mirror` writes what `model_source` reads: a mirror built from the lab's hub double (real
huggingface_hub against it), then read by the real code a run uses (checkpoint.snapshot through the model
source, the model stage's job, the fetch script in peer mode). Re-runs copy nothing; a corrupt file is replaced;
nothing unverified or half-written is left in DEST; a host's verified copy is a source too."""

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from modelfleet import FILES_DIR, REPO_ROOT
from modelfleet.fleet import mirror
from modelfleet.plan import checkpoint
from modelfleet.plan.inventory import resolve
from modelfleet.plan.pins import checkpoint_of, pinned_revision
from modelfleet.run.stages import model as model_stage
from tests.helpers.listener import free_port
from tests.helpers.made_keys import made_key

pytestmark = pytest.mark.slow  # the mirror command in child interpreters, copying files

FETCH = str(FILES_DIR / "modelfleet_fetch.py")
REPO = "modelfleet/tiny-lab"
TOKEN_ENV = "MODELFLEET_MIRROR_TEST_TOKEN"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The lab's hub double on a free loopback port, gated by a token: (endpoint, token, stats())."""
    top = tmp_path_factory.mktemp("hub")
    token = made_key("hub-token")
    (top / "token").write_text(token + "\n")
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(REPO_ROOT / "lab" / "hub_double" / "hub_double.py"),
                             "--data", str(top / "data"), "--listen", f"127.0.0.1:{port}",
                             "--token-file", str(top / "token"), "--repo", f"{REPO}=main:3:0.25"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"

    def stats():
        return json.load(urllib.request.urlopen(f"{endpoint}/_lab/stats", timeout=5))

    for _ in range(200):
        try:
            stats()
            break
        except OSError:
            time.sleep(0.05)
    yield endpoint, token, stats
    proc.terminate()
    proc.wait(10)


def host(endpoint: str, **extra) -> dict:
    return {"hardware": "h200", "gpu_count": 1, "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm",
            "hf_endpoint": endpoint, "hf_token_env": TOKEN_ENV, "gpu_stack": False, **extra}


@pytest.fixture()
def inventory(hub, monkeypatch):
    endpoint, token, _ = hub
    monkeypatch.setenv(TOKEN_ENV, token)
    result = resolve([("h1", host(endpoint)), ("h2", host(endpoint))])
    assert result.errors == []
    return result


def quiet(line: str) -> None:
    pass


def files_in(dest: Path) -> set[str]:
    return {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()}


def test_mirror_is_what_model_source_reads_and_a_host_fetches_from_it(inventory, hub, tmp_path):
    dest = tmp_path / "mirror"
    summary = mirror.build(inventory, ["h1", "h2"], dest, log=quiet)
    [rev] = summary["revisions"]
    commit = rev["commit"]
    assert rev["hosts"] == ["h1", "h2"] and rev["copied"] == rev["files"] > 3
    assert summary["model_source"] == dest.resolve().as_uri()
    # Exactly <repo>/<commit>/ with its manifest, and nothing temporary left beside it.
    manifest = json.loads((dest / REPO / commit / checkpoint.MANIFEST).read_text())
    assert manifest["repo"] == REPO and manifest["commit"] == commit
    assert files_in(dest) == {f"{REPO}/{commit}/{p}" for p in manifest["files"]} | {
        f"{REPO}/{commit}/{checkpoint.MANIFEST}", mirror.LOCK}
    assert all(len(e["sha256"]) == 64 for e in manifest["files"].values())  # every byte checkable
    hub_files = checkpoint.snapshot(REPO, "main", hub[0], TOKEN_ENV).files
    assert {p: m["size"] for p, m in hub_files.items()} == {p: e["size"] for p, e in manifest["files"].items()}

    # A host of a site whose model_source is the mirror: the run's own code, from resolving the pin to the fetch.
    site = resolve([("h1", host("http://127.0.0.1:9", model_source=summary["model_source"], revision=commit,
                                model_root=str(tmp_path / "models")))])
    assert site.errors == []
    plan = site.hosts["h1"]
    svc = pinned_revision(plan, plan.services[0])
    snap = checkpoint_of(plan, plan.services[0])
    assert snap.commit == commit and set(snap.files) == set(manifest["files"])
    job = tmp_path / "job.json"
    job.write_text(model_stage._job(plan, svc, snap))
    source_url = f"{plan.model_source.rstrip('/')}/{snap.repo}/{snap.commit}/"  # as the model stage names it
    run = subprocess.run([sys.executable, FETCH, str(job), "peer", source_url], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["ok"] and sorted(report["fetched"]) == sorted(manifest["files"])
    fetched = json.loads((Path(svc.model_dir) / checkpoint.MANIFEST).read_text())
    assert fetched["commit"] == commit
    assert {p: e["sha256"] for p, e in fetched["files"].items()} == {
        p: e["sha256"] for p, e in manifest["files"].items()}


def test_a_rerun_copies_nothing_and_a_corrupt_file_is_copied_again(inventory, hub, tmp_path):
    dest = tmp_path / "mirror"
    first = mirror.build(inventory, ["h1"], dest, log=quiet)
    commit = first["revisions"][0]["commit"]
    manifest_path = dest / REPO / commit / checkpoint.MANIFEST
    written = manifest_path.stat().st_mtime_ns
    before = hub[2]()["bytes_served"]
    again = mirror.build(inventory, ["h1"], dest, log=quiet)
    assert again["copied"] == 0 and again["revisions"][0]["already_verified"] == first["revisions"][0]["files"]
    assert hub[2]()["bytes_served"] == before and manifest_path.stat().st_mtime_ns == written
    shard = dest / REPO / commit / "model-00002-of-00003.safetensors"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))  # same size, new mtime: the manifest no longer vouches for it
    lines = []
    fixed = mirror.build(inventory, ["h1"], dest, log=lines.append)
    assert fixed["copied"] == 1 and fixed["bytes_copied"] == shard.stat().st_size
    entry = json.loads(manifest_path.read_text())["files"][shard.name]
    assert mirror.fetch.sha256_of(shard) == entry["sha256"] and shard.stat().st_mtime == entry["mtime"]
    assert any("1 to copy" in line for line in lines) and any("verified [1/1]" in line for line in lines)


def test_a_file_that_fails_its_check_never_enters_the_mirror(inventory, tmp_path, monkeypatch):
    dest = tmp_path / "mirror"
    left = dest / f"{mirror.STAGING}99999"
    left.mkdir(parents=True)
    (left / "half.safetensors").write_bytes(b"x")  # a run that died mid-copy
    real = mirror.HubSource.copy

    def tampered(self, want, commit, rel, staging):
        real(self, want, commit, rel, staging)
        if rel == "model-00001-of-00003.safetensors":
            with open(staging / rel, "r+b") as f:
                f.write(b"\0\0\0\0")

    monkeypatch.setattr(mirror.HubSource, "copy", tampered)
    with pytest.raises(mirror.MirrorError, match=r"refused modelfleet/tiny-lab@\w+: 1 file\(s\) do not match"):
        mirror.build(inventory, ["h1"], dest, log=quiet)
    [commit] = os.listdir(dest / REPO)
    present = files_in(dest)
    assert f"{REPO}/{commit}/model-00001-of-00003.safetensors" not in present
    assert f"{REPO}/{commit}/{checkpoint.MANIFEST}" not in present  # no host takes an incomplete revision
    assert not [p for p in present if mirror.STAGING in p or "partial" in p or p.endswith(".tmp")]
    monkeypatch.setattr(mirror.HubSource, "copy", real)
    done = mirror.build(inventory, ["h1"], dest, log=quiet)
    assert done["copied"] == 1  # the others were verified and kept


class LocalSftp:
    """The SFTP calls HostSource makes, on this machine's files (the lab test does it over SSH)."""

    def open(self, path, mode="r"):
        return open(path, mode)

    def get(self, remote, local):
        shutil.copyfile(remote, local)


HOST_SOURCE = mirror.HostSource


def from_host(result, name: str) -> mirror.HostSource:
    source = HOST_SOURCE.__new__(HOST_SOURCE)
    source.plan, source.name, source.sftp, source.dirs = result.hosts[name], f"host {name}", LocalSftp(), {}
    source.conn = type("Conn", (), {"close": lambda self: None})()
    return source


def test_a_host_that_holds_the_revision_is_a_source_checked_against_its_own_manifest(inventory, tmp_path,
                                                                                      monkeypatch):
    hub_mirror = mirror.build(inventory, ["h1"], tmp_path / "from-hub", log=quiet)
    commit = hub_mirror["revisions"][0]["commit"]
    # The host's copy, as its fetch left it: model_root/<model id>/<commit>/ with the host's manifest.
    models = tmp_path / "models"
    site = resolve([("h1", host("http://127.0.0.1:9", model_source=hub_mirror["model_source"], revision=commit,
                                model_root=str(models)))])
    plan = site.hosts["h1"]
    svc, snap = pinned_revision(plan, plan.services[0]), checkpoint_of(plan, plan.services[0])
    job = tmp_path / "job.json"
    job.write_text(model_stage._job(plan, svc, snap))
    subprocess.run([sys.executable, FETCH, str(job), "peer", f"{hub_mirror['model_source']}/{REPO}/{commit}/"],
                   check=True, capture_output=True)
    assert Path(svc.model_dir) == models / "tiny-lab" / commit
    monkeypatch.setattr(mirror, "HostSource", lambda result, name: from_host(result, name))
    summary = mirror.build(site, ["h1"], tmp_path / "from-host", from_host="h1", log=quiet)
    assert summary["source"] == "host h1" and summary["revisions"][0]["copied"] == hub_mirror["revisions"][0]["files"]
    ours = json.loads((tmp_path / "from-host" / REPO / commit / checkpoint.MANIFEST).read_text())["files"]
    theirs = json.loads((tmp_path / "from-hub" / REPO / commit / checkpoint.MANIFEST).read_text())["files"]
    assert {p: e["sha256"] for p, e in ours.items()} == {p: e["sha256"] for p, e in theirs.items()}
    # A host whose bytes no longer match its manifest is not copied from.
    shard = Path(svc.model_dir) / "model-00003-of-00003.safetensors"
    with open(shard, "r+b") as f:
        f.write(b"\1\2\3")
    with pytest.raises(mirror.MirrorError, match="do not match host h1's size and checksum"):
        mirror.build(site, ["h1"], tmp_path / "from-bad-host", from_host="h1", log=quiet)
    assert not (tmp_path / "from-bad-host" / REPO / commit / shard.name).exists()


def test_from_host_needs_a_pinned_commit(inventory):
    source = from_host(inventory, "h1")
    [want] = mirror.wanted(inventory, ["h1"])
    with pytest.raises(mirror.MirrorError, match="needs `revision` pinned to a 40-hex commit"):
        source.listing(want)


def test_revisions_are_gathered_once_with_their_hosts(hub, monkeypatch):
    endpoint = hub[0]
    result = resolve([("h1", host(endpoint)), ("h2", host(endpoint, revision="a" * 40)),
                      ("h3", host(endpoint))])
    wants = mirror.wanted(result, ["h1", "h2", "h3"])
    assert [(w.repo, w.revision, w.hosts, w.patterns) for w in wants] == [
        (REPO, "main", ["h1", "h3"], None), (REPO, "a" * 40, ["h2"], None)]


def test_the_command_prints_json_on_stdout_and_progress_on_stderr(hub, tmp_path):
    endpoint, token, _ = hub
    inv = tmp_path / "site.py"
    inv.write_text(f"gpu_hosts = [('h1', {host(endpoint)!r})]\n")
    env = {**os.environ, TOKEN_ENV: token}
    run = subprocess.run([sys.executable, "-m", "modelfleet.cli", "mirror", str(inv), str(tmp_path / "m")],
                         capture_output=True, text=True, env=env, cwd=REPO_ROOT)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["ok"] and summary["revisions"][0]["repo"] == REPO
    assert "mirror: modelfleet/tiny-lab@" in run.stderr and token not in run.stderr + run.stdout
    assert "pin revision" in summary["notes"][0]
    env[TOKEN_ENV] = "wrong"
    refused = subprocess.run([sys.executable, "-m", "modelfleet.cli", "mirror", str(inv), str(tmp_path / "n")],
                             capture_output=True, text=True, env=env, cwd=REPO_ROOT)
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith("modelfleet mirror: ") and len(refused.stderr.strip().splitlines()) == 1


def test_a_listing_that_names_a_file_outside_its_folder_is_refused_before_anything_is_written(inventory, tmp_path,
                                                                                               monkeypatch):
    """A manifest (or file list) naming `../x` or an absolute path could put files anywhere on the control node:
    the revision is refused whole, nothing of it copied."""
    dest = tmp_path / "mirror"
    real = mirror.HubSource.listing

    def hostile(self, want):
        commit, files = real(self, want)
        return commit, {**files, "../../escaped.txt": next(iter(files.values()))}

    monkeypatch.setattr(mirror.HubSource, "listing", hostile)
    with pytest.raises(mirror.MirrorError, match=r"lists files outside its folder \(\.\./\.\./escaped\.txt\)"):
        mirror.build(inventory, ["h1"], dest, log=quiet)
    assert not (tmp_path / "escaped.txt").exists() and not (dest / "escaped.txt").exists()
    assert not [p for p in files_in(dest) if p.endswith(".safetensors")]


# huggingface_hub's own answer, in a child interpreter (its HTTP stack does not import under pyinfra's patches).
MODEL_INFO = """
import json, sys
from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError
asked = json.load(sys.stdin)
try:
    info = HfApi(endpoint=asked["endpoint"], token=asked["token"] or False).model_info(
        asked["repo"], revision=asked["revision"], files_metadata=True)
except HfHubHTTPError as error:
    print(json.dumps({"error": type(error).__name__}))
    raise SystemExit
print(json.dumps({"commit": info.sha, "files": {s.rfilename: {"size": s.size, "sha256": s.lfs.sha256 if s.lfs else None,
                                                            "blob_id": s.blob_id} for s in info.siblings}}))
"""


def model_info(endpoint: str, token: str | None, revision: str = "main", repo: str = REPO) -> dict:
    asked = json.dumps({"endpoint": endpoint, "token": token, "repo": repo, "revision": revision})
    run = subprocess.run([sys.executable, "-c", MODEL_INFO], input=asked, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_the_runs_hub_request_answers_as_huggingface_hubs_model_info(hub):
    """The commit and files a run pins from the hub (checkpoint.snapshot, one GET in the run's process) are
    huggingface_hub's `model_info(files_metadata=True)`'s, and its refusals name the same hub errors."""
    endpoint, token, _ = hub
    ours = checkpoint._hub_metadata({"endpoint": endpoint, "token": token, "repo": REPO, "revision": "main"})
    theirs = model_info(endpoint, token)
    assert ours == theirs and len(ours["commit"]) == 40 and ours["files"]
    assert any(meta["sha256"] for meta in ours["files"].values())  # LFS files carry their digest
    refusals = {"GatedRepo": (None, "main"), "RevisionNotFound": (token, "no-such-branch")}
    for name, (key, revision) in refusals.items():
        said = checkpoint._hub_metadata({"endpoint": endpoint, "token": key, "repo": REPO, "revision": revision})
        assert said["error"].startswith("HTTP 4") and name in said["error"], said
        assert model_info(endpoint, key, revision) == {"error": f"{name}Error"}  # what huggingface_hub raised
    unreachable = checkpoint._hub_metadata({"endpoint": "http://127.0.0.1:9", "token": None, "repo": REPO,
                                            "revision": "main"})
    assert unreachable["error"].startswith("hub unreachable: ConnectionRefusedError"), unreachable
