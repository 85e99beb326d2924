"""Stage model: each service's checkpoint at a pinned commit, complete and verified, in its own directory under
model_root/<model>/<commit>, with a `current` pointer and older revisions pruned to model_keep_revisions.

One host per checkpoint group (the pool by default) downloads from the hub (or the air-gapped source); the
others copy from it over HTTP on the pool's network while it serves its verified copy from a transient unit,
so hub egress for a group is one checkpoint. By default (model_fanout: swarm) the others fetch it piece by
piece from every member at once, each serving the pieces it verified while it receives (_swarm); with `tree`,
hosts that got their copy serve the next ones (fanout_waves): log(N) waves, no host serving more than the width.
Every host verifies what it got (files/modelfleet_fetch.py).
Which hosts lack what is known before anything runs: the group's hosts' state is read once each.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import shlex
from functools import partial
from io import BytesIO

from pyinfra import host, state
from pyinfra.api import FileUploadCommand, FunctionCommand, StringCommand, deploy, operation

from modelfleet import FILES_DIR
from modelfleet.base import keys, masking
from modelfleet.base.host_commands import CURRENT, revisions_dir
from modelfleet.host.operations.files import content_file, directory
from modelfleet.host.operations.report import fail_host, note
from modelfleet.host.transfer import (
    FANOUT_FLOOR_BYTES_S,
    FANOUT_MARGIN_S,
    FANOUT_PORT,
    FETCH,
    SWARM,
    VENV,
    checkpoint_fetched,
    fanout_address,
    fanout_serving,
    fanout_unit,
    fanout_waves,
    held_files,
    peer_copied,
    pieces_read,
    swarm_copied,
    wave_sources,
)
from modelfleet.plan.checkpoint import Snapshot, missing_files
from modelfleet.plan.inventory.plan import HostPlan, ServicePlan
from modelfleet.plan.pins import checkpoint_of, pinned_revision
from modelfleet.run.context import HostRun
from modelfleet.run.stages import TOOLS_BIN

NAME = "model"
PINS: frozenset[str] = frozenset({"revisions", "listings"})

# The hub client, pinned with the sha256 of every file pip may take (files/hub_client.in, `make lock`); the venv
# keeps the lock it was built from, so a venv of another lock (or of none: an older modelfleet's) is built again.
HF_CLIENT = next(line for line in (FILES_DIR / "hub_client.in").read_text().splitlines()
                 if line.strip() and not line.startswith("#"))  # the requirement, as `urls` lists it
HUB_CLIENT_LOCK = FILES_DIR / "hub_client.txt"
HUB_CLIENT_BUILT = f"{VENV}/modelfleet-hub-client.txt"
TEMP_FACTOR = 1.05  # partial files beside the ones being replaced


def _checkpoints(plan: HostPlan) -> dict[str, tuple[ServicePlan, Snapshot]]:
    """model_dir -> (pinned service, snapshot); two services of one model and commit share a directory."""
    out = {}
    for svc in plan.services:
        pinned = pinned_revision(plan, svc)
        out.setdefault(pinned.model_dir, (pinned, checkpoint_of(plan, svc)))
    return out


def _group(ctx: HostRun, svc: ServicePlan) -> list[str]:
    """
    The hosts of this run sharing this checkpoint, in inventory order: the first one fetches from the source.
    (With --limit, a host whose group's first member is left out fetches from the source itself.)
    """
    members = []
    active = {h.name for h in state.inventory.get_active_hosts()}
    for name, plan in ctx.inventory.hosts.items():
        if name in active and any(s.checkpoint_group == svc.checkpoint_group and s.model.id == svc.model.id
                                  for s in plan.services):
            members.append(name)
    return members


def _downloader(ctx: HostRun, svc: ServicePlan) -> str:
    """The host a run over the whole inventory has download from the source (the group's first member),
    whatever --limit leaves in this run: only it keeps the hub token between runs."""
    return next(name for name, plan in ctx.inventory.hosts.items()
                if any(s.checkpoint_group == svc.checkpoint_group and s.model.id == svc.model.id
                       for s in plan.services))


def wants(plan: HostPlan, probe: dict) -> dict:
    dirs = list(_checkpoints(plan))
    return {"trees": dirs, "units": [f"{fanout_unit(s.checkpoint_group)}.service" for s in plan.services],
            "paths": [TOOLS_BIN, FETCH, SWARM, HUB_CLIENT_BUILT, plan.config_dir,
                                     f"{plan.config_dir}/hf-token", *dirs, *(_job_path(plan, d) for d in dirs)]}


def _job_path(plan: HostPlan, model_dir: str) -> str:
    model, commit = model_dir.rstrip("/").split("/")[-2:]
    return f"{plan.config_dir}/checkpoint-{model}-{commit[:12]}.json"


def _job(plan: HostPlan, svc: ServicePlan, snap: Snapshot) -> str:
    return json.dumps({"repo": snap.repo, "commit": snap.commit, "endpoint": plan.hf_endpoint,
                       "dest": svc.model_dir, "token_file": f"{plan.config_dir}/hf-token",
                       "host": plan.name, "stall_s": plan.model_stall_s,
                       "files": snap.files}, indent=1, sort_keys=True) + "\n"


def _engines_of(plan: HostPlan, model_dir: str) -> list[str]:
    """The units of this host's services serving the revision in `model_dir` (restarted after a repair)."""
    return sorted({svc.unit_name for svc in plan.services if pinned_revision(plan, svc).model_dir == model_dir})


@operation()
def current_pointer(parent: str, commit: str, current: str | None):
    if current == commit:
        host.noop(f"{parent}/{CURRENT} -> {commit[:12]}")
        return
    yield StringCommand("ln", "-sfn", commit, shlex.quote(f"{parent}/{CURRENT}"))


@operation()
def revisions_pruned(parent: str, remove: list[str]):
    if not remove:
        host.noop("no revision to prune")
        return
    # With each revision, the store an engine registered it in beside it (modelfleet.plan.render.store_dir: Ollama's).
    yield StringCommand("rm", "-rf", *[arg for commit in remove for arg in (
        shlex.quote(f"{parent}/{commit}"), shlex.quote(f"{parent}/{commit}") + ".*-store")])


@operation()
def litter_removed(parent: str, commit: str, partials: dict, unfinished: list[str]):
    """Partial files (`.<name>.<pid>.modelfleet-partial`, huggingface_hub's `.incomplete`) and revision
    directories without a manifest that a fetch no longer running left behind (its process died, its host
    restarted): no live fetch holds their lock."""
    if not partials and not unfinished:
        host.noop("no partial file or unfinished revision left behind")
        return
    what = []
    if partials:
        what.append(f"{len(partials)} partial file(s) ({sum(partials.values()) / 1e6:.1f} MB) in "
                    f"{parent}/{commit[:12]}")
    if unfinished:
        what.append(f"unfinished revision(s) {', '.join(r[:12] for r in unfinished)}")
    yield FunctionCommand(note, (f"modelfleet: removing {' and '.join(what)}, left by a fetch that is no longer "
                                 "running",), {})
    if partials:
        yield StringCommand("rm", "-f", "--", *(shlex.quote(f"{parent}/{commit}/{rel}")
                                                for rel in sorted(partials)))
    if unfinished:
        yield StringCommand("rm", "-rf", "--", *(shlex.quote(f"{parent}/{r}") for r in unfinished))


@operation()
def hf_client_installed(built: dict | None, needed: bool):
    """A venv the stage owns, with huggingface_hub (and hf_xet) from the hashed lock: pip refuses a file whose
    sha256 the lock does not name, and installs nothing the lock does not list. `built`: the state of the lock
    the venv was built from (HUB_CLIENT_BUILT)."""
    lock = HUB_CLIENT_LOCK.read_text()
    if not needed:
        host.noop("this host does not download from the hub")
        return
    if (built or {}).get("sha256") == hashlib.sha256(lock.encode()).hexdigest():
        host.noop(f"{VENV} has huggingface_hub from {HUB_CLIENT_LOCK.name}")
        return
    temp = f"{VENV}.{HUB_CLIENT_LOCK.name}.modelfleet-tmp"  # in root's /opt/modelfleet, beside the venv
    yield StringCommand("mkdir", "-p", posixpath.dirname(VENV))
    yield FileUploadCommand(BytesIO(lock.encode()), temp)
    yield StringCommand("python3", "-m", "venv", "--clear", VENV, "&&", f"{VENV}/bin/pip", "install", "-q",
                        "--disable-pip-version-check", "--require-hashes", "--no-deps", "-r", temp, "&&",
                        "mv", "-f", temp, HUB_CLIENT_BUILT)


@operation()
def hub_token_file(dest: str, token: str | None, current: dict | None):
    """The hub token for the fetch script, 0600, only on the host that downloads from the hub: a host that no
    longer does (it copies from a peer now) loses the copy an earlier run left."""
    if not token:
        if current:
            yield StringCommand("rm", "-f", shlex.quote(dest))
            return
        host.noop("no hub token needed here")
        return
    yield from content_file._inner(dest=dest, content=token + "\n", current=current, mode="0600", secret=True)


def _to_prune(tree: dict, commit: str, keep: int) -> list[str]:
    """Older revisions beyond `keep`; never the new one nor the one `current` names (a unit may still run it)."""
    others = [r for r in tree.get("revisions", []) if r not in (commit, tree.get("current"))]
    kept = 1 if tree.get("current") not in (None, commit) else 0
    return others[max(0, keep - kept):]


# Over 60 lines: every host must list every checkpoint operation in one order (pyinfra orders operations by their
# lines), so the stage's operations stand in this one function; the swarm's and the fan-out's steps are the
# functions below it (_swarm, _tree).
@deploy("modelfleet model")
def run(ctx: HostRun):
    plan = ctx.plan
    if not plan.services:  # a router-only host (modelfleet.plan.inventory.router_only): nothing to fetch or check
        return
    mine = ctx.deployed()
    directory(name=f"Config directory {plan.config_dir} (0700)", path=plan.config_dir,
              current=mine["paths"].get(plan.config_dir), mode="0700")
    directory(name=f"Tools directory {TOOLS_BIN}", path=TOOLS_BIN, current=mine["paths"].get(TOOLS_BIN))
    content_file(name=f"Fetch script {FETCH}", dest=FETCH, content=(FILES_DIR / "modelfleet_fetch.py")
                 .read_text(), current=mine["paths"].get(FETCH), mode="0755")
    content_file(name=f"Swarm module {SWARM}", dest=SWARM, content=(FILES_DIR / "modelfleet_swarm.py").read_text(),
                 current=mine["paths"].get(SWARM), mode="0644")
    for model_dir, (svc, snap) in _checkpoints(plan).items():
        tree = mine["trees"][model_dir]
        members = _group(ctx, svc)
        seed = members[0]
        missing = missing_files(tree, snap, plan.model_reverify)
        needed = sum(snap.files[p]["size"] for p in missing) * TEMP_FACTOR
        if tree.get("free_bytes") is not None and needed > tree["free_bytes"]:
            fail_host(name=f"Disk check for {snap.repo}@{snap.commit[:12]}", reasons=[
                f"disk: {model_dir} needs {needed / 1e9:.3f} GB for {len(missing)} file(s) of {snap.repo}@"
                f"{snap.commit[:12]}, {tree['free_bytes'] / 1e9:.3f} GB free"])
            continue
        parent = revisions_dir(model_dir)
        directory(name=f"Revision directory {model_dir}", path=model_dir, current=mine["paths"].get(model_dir))
        busy = set(tree.get("busy", []))
        litter_removed(name=f"Leftovers of earlier fetches in {parent}", parent=parent, commit=snap.commit,
                       partials={} if snap.commit in busy else tree.get("partials", {}),
                       unfinished=[r for r in tree.get("unfinished", [])
                                   if r not in (snap.commit, tree.get("current"))])
        job = _job_path(plan, model_dir)
        content_file(name=f"Fetch job {job}", dest=job, content=_job(plan, svc, snap),
                     current=mine["paths"].get(job), mode="0600")
        # Every host calls every operation (a noop where it has no part): pyinfra orders operations by each
        # host's sequence, so the seed's fetch and serve precede the peers' copies only if all hosts list them.
        is_seed = host.name == seed
        source_url = f"{plan.model_source.rstrip('/')}/{snap.repo}/{snap.commit}/" if plan.model_source else None
        from_hub = is_seed and not source_url
        hf_client_installed(name=f"huggingface_hub in {VENV}", needed=from_hub and bool(missing),
                            built=mine["paths"].get(HUB_CLIENT_BUILT))
        # Only the group's downloader keeps the token; a host a --limit run (a rolling upgrade's batch) left to
        # download without it gets one for that download alone, as a full run would have it.
        downloader = _downloader(ctx, svc)
        downloads = from_hub and (host.name == downloader or bool(missing))
        hub_token_file(name=f"Hub token {plan.config_dir}/hf-token (0600)", dest=f"{plan.config_dir}/hf-token",
                       token=keys.from_env(plan.hf_token_env) if downloads else None,
                       current=mine["paths"].get(f"{plan.config_dir}/hf-token"))
        checkpoint_fetched(name=f"Fetch {snap.repo}@{snap.commit[:12]} from {masking.url(source_url) or 'the hub'}",
                           job=job,
                           mode="peer" if source_url else "hub", source=source_url,
                           missing=missing if is_seed else [], reverify=plan.model_reverify,
                           restart=_engines_of(plan, model_dir),
                           source_name=f"the mirror ({source_url})" if source_url else f"the hub ({plan.hf_endpoint})")
        borrowed = downloads and host.name != downloader and bool(keys.from_env(plan.hf_token_env))
        hub_token_file(name=f"Hub token {plan.config_dir}/hf-token removed after the download "
                       "(not the group's downloader)", dest=f"{plan.config_dir}/hf-token", token=None,
                       current={"kind": "file"} if borrowed else None)
        unit_state = mine["units"].get(f"{fanout_unit(svc.checkpoint_group)}.service") or {}
        leftover = unit_state.get("ActiveState") in ("active", "activating", "failed")
        group = svc.checkpoint_group
        urls = {name: f"http://{fanout_address(ctx.inventory.hosts[name])}:{FANOUT_PORT}/" for name in members}
        peer_job = {**json.loads(_job(plan, svc, snap)), "kind": "checkpoint"}
        if ctx.inventory.hosts[members[0]].model_fanout == "swarm":
            _swarm(ctx, plan, snap, members, model_dir, job, bool(missing), leftover, urls, peer_job, group)
        else:
            _tree(ctx, plan, snap, members, model_dir, job, bool(missing), leftover, urls, peer_job, group)
        current_pointer(name=f"{parent}/{CURRENT} -> {snap.commit[:12]}", parent=parent, commit=snap.commit,
                        current=tree.get("current"))
        revisions_pruned(name=f"Prune revisions of {svc.model.id} beyond {plan.model_keep_revisions}",
                         parent=parent, remove=_to_prune(_finished(tree), snap.commit, plan.model_keep_revisions))


def _swarm(ctx: HostRun, plan: HostPlan, snap: Snapshot, members: list[str], model_dir: str, job: str,
           missing: bool, leftover: bool, urls: dict, peer_job: dict, group: str) -> None:
    """One copy for the whole group: every host lacking files fetches pieces from all the others at once, each
    serving what it verified meanwhile (its server reads the pieces its fetch checked); the seed's piece
    digests reach the receivers through the control node."""
    receivers = ctx.fanout((group, snap.repo, snap.commit, "swarm"),
                           lambda: [name for name in members[1:] if _peer_missing(ctx, name, snap)])
    # The piece digests come from a member that holds a verified copy before this run (the seed downloading
    # now only when none does): a seed whose hub froze leaves the others a source.
    reader = ctx.fanout((group, snap.repo, snap.commit, "pieces"), lambda: next(
        (name for name in members if name not in receivers and not _peer_missing(ctx, name, snap)), members[0]))
    receiving = host.name in receivers and missing
    held_files((group, host.name)).update(snap.files)  # holder or receiver: the names its server may send
    pieces_read(name=f"Piece digests of {snap.commit[:12]} for the group's receivers", group=group,
                directory_=model_dir, files=snap.files, needed=bool(receivers) and host.name == reader)
    fanout_serving(name=f"Serve {snap.commit[:12]} to the group's peers (verified pieces as they arrive)",
                   group=group, directory_=model_dir, address=fanout_address(plan), port=FANOUT_PORT,
                   serve=True, needed=bool(receivers), leftover=leftover, config_dir=plan.config_dir,
                   files_key=(group, host.name), rate_mb_s=plan.model_fanout_rate_mb_s,
                   idle_s=2 * plan.model_stall_s, swarm=bool(receiving),
                   lifetime_s=int(FANOUT_MARGIN_S + snap.total_bytes * len(receivers) / FANOUT_FLOOR_BYTES_S))
    swarm_copied(name=f"Copy {snap.repo}@{snap.commit[:12]} piece by piece from the group's peers", job_path=job,
                 job=peer_job, group=group, peers={name: urls[name] for name in members if name != host.name},
                 holders=[name for name in members if name not in receivers],
                 needed=bool(receiving), rate_mb_s=plan.model_fanout_rate_mb_s, reverify=plan.model_reverify,
                 restart=_engines_of(plan, model_dir))
    fanout_serving(name="Stop serving to peers", group=group, directory_=model_dir,
                   address=fanout_address(plan), port=FANOUT_PORT, serve=False, needed=bool(receivers),
                   config_dir=plan.config_dir)


def _tree(ctx: HostRun, plan: HostPlan, snap: Snapshot, members: list[str], model_dir: str, job: str,
          missing: bool, leftover: bool, urls: dict, peer_job: dict, group: str) -> None:
    """Whole copies in waves: hosts that got theirs serve the next wave (model_fanout `tree`)."""
    waves = ctx.fanout((group, snap.repo, snap.commit), partial(_group_waves, ctx, members, snap))
    copies = sum(len(wave) for wave in waves)
    served = False
    # One serve + copy pair per wave (at least one, so a leftover server is always looked at); every host
    # lists them all, so wave k's copies run after wave k-1's on every host.
    for number, wave in enumerate(waves or [{}], 1):
        serves = host.name in wave.values()
        if serves:
            held_files((group, host.name)).update(snap.files)
        fanout_serving(name=f"Serve {snap.commit[:12]} to the group's peers (wave {number}/{len(waves) or 1})",
                       group=group, directory_=model_dir, address=fanout_address(plan), port=FANOUT_PORT,
                       serve=True, needed=serves, leftover=leftover and number == 1, config_dir=plan.config_dir,
                       files_key=(group, host.name), rate_mb_s=plan.model_fanout_rate_mb_s,
                       idle_s=2 * plan.model_stall_s,
                       lifetime_s=int(FANOUT_MARGIN_S + snap.total_bytes * copies / FANOUT_FLOOR_BYTES_S))
        served = served or serves
        peer_copied(name=f"Copy {snap.repo}@{snap.commit[:12]} from a peer (wave {number}/{len(waves) or 1})",
                    job_path=job, job=peer_job, group=group,
                    source=wave.get(host.name), alternatives=wave_sources(waves, number), urls=urls,
                    needed=missing, reverify=plan.model_reverify, restart=_engines_of(plan, model_dir))
    fanout_serving(name="Stop serving to peers", group=group, directory_=model_dir,
                   address=fanout_address(plan), port=FANOUT_PORT, serve=False, needed=served,
                   config_dir=plan.config_dir)


def _finished(tree: dict) -> dict:
    """The tree with unfinished revisions left out of its revisions (never kept for rollback; removed instead)."""
    return {**tree, "revisions": [r for r in tree.get("revisions", []) if r not in tree.get("unfinished", [])]}


def _group_waves(ctx: HostRun, members: list[str], snap: Snapshot) -> list[dict[str, str]]:
    """The group's waves: the first member (the seed) and every member whose copy is complete serve; the
    seed's model_fanout_width holds for the group."""
    holders = {members[0]} | {name for name in members[1:] if not _peer_missing(ctx, name, snap)}
    return fanout_waves(members, holders, ctx.inventory.hosts[members[0]].model_fanout_width)


def _peer_missing(ctx: HostRun, name: str, snap: Snapshot) -> bool:
    """Does group member `name` lack files of this checkpoint? (Its own model_root may differ from ours.)"""
    peer_plan = ctx.inventory.hosts[name]
    peer_state = ctx.deployed_on(name)
    for model_dir, (_, peer_snap) in _checkpoints(peer_plan).items():
        if peer_snap.commit == snap.commit and peer_snap.repo == snap.repo:
            return bool(missing_files(peer_state["trees"].get(model_dir, {}), snap, peer_plan.model_reverify))
    return False

