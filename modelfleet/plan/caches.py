"""Engine caches that outlive the container (pure, but for the pruning operation): each engine's compile and JIT
cache roots (the catalog's `caches:` per engine) point into one directory on the model filesystem,
<model_root>/.cache/<engine>/<key>, mounted read-write at /cache. The key is a short hash of what invalidates
those caches: the image (its digest when pinned), the GPU model, the driver branch, the model revision, the
engine's full argument list (but where it listens and where its pool meets), the parallel layout and the node's
rank. A change of any of them starts a new directory; the inputs are written beside it (<key>.key.json in the
engine's root, where the container cannot write: root never writes in the directory the container does) so an
operator can see why a key changed. Old keys are pruned like old revisions: the newest `model_keep_revisions`
besides those in use."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass

from pyinfra import host
from pyinfra.api import StringCommand, operation

from modelfleet.base.host_commands import revisions_dir
from modelfleet.plan.inventory.plan import ServicePlan
from modelfleet.plan.venvs import ENGINE_USER

CONTAINER_DIR = "/cache"
KEY_FILE = ".key.json"  # after the key, beside its directory
KEY_LENGTH = 16
KEY_RE = re.compile(rf"[0-9a-f]{{{KEY_LENGTH}}}")
# Where a rank's cache goes when its pool's ranks disagree (stages/engine_cache): beside its key, pruned with it.
SET_ASIDE = ".modelfleet-set-aside"
ASIDE_RE = re.compile(rf"([0-9a-f]{{{KEY_LENGTH}}}){re.escape(SET_ASIDE)}")


@dataclass(frozen=True)
class EngineCache:
    root: str  # <model_root>/.cache/<engine>: every key of that engine on the host
    key: str
    inputs: dict
    env: dict  # variable -> path inside the container
    owner: str = "root"  # who the engine runs as: a venv engine's own user writes its cache (modelfleet.plan.venvs)

    @property
    def dir(self) -> str:
        return f"{self.root}/{self.key}"

    @property
    def key_file(self) -> str:
        return f"{self.dir}{KEY_FILE}"

    @property
    def key_json(self) -> str:
        return json.dumps({"key": self.key, "inputs": self.inputs}, indent=1, sort_keys=True) + "\n"


def model_root(svc: ServicePlan) -> str:
    """The model filesystem's root: the parent of the model's revisions directory (host_commands' layout)."""
    return revisions_dir(svc.model_dir).rsplit("/", 1)[0]


def image_identity(image: str) -> str:
    """What of the image names its content: the digest when the reference is pinned, else the reference."""
    return image.split("@", 1)[1] if "@" in image else image


PLACEMENT = "<placement>"


def placement_flags(engine) -> set[str]:
    """The engine's flags whose value says where it listens or where its pool meets (its host and port flags,
    and the multi-node flags given the head's address): nothing compiled depends on them, and they differ
    between hosts that could share one cache."""
    flags = {engine.host_flag, engine.port_flag}
    for mode in engine.multinode.values():
        for part in (mode.all, mode.workers):
            flags |= {flag for flag, value in zip(part, part[1:], strict=False) if "{head}" in value}
    return flags


def key_argv(svc: ServicePlan, argv: list[str]) -> list[str]:
    """The argv as the key sees it: the values of placement flags replaced by one word."""
    placed, out = placement_flags(svc.engine), []
    for arg in argv:
        out.append(PLACEMENT if out and out[-1] in placed else arg)
    return out


def key_inputs(svc: ServicePlan, argv: list[str]) -> dict:
    """Everything a cached kernel or compiled graph depends on, as far as the plan knows it."""
    hw = svc.hardware
    return {"engine": svc.engine_name, "image": image_identity(svc.image), "gpu": hw.gpu_name or hw.id,
            "driver_branch": svc.driver_branch, "model": svc.hf_repo, "revision": svc.revision,
            "argv": key_argv(svc, argv), "layout": svc.recipe.layout.model_dump(), "nnodes": svc.nnodes,
            "node_rank": svc.node_rank, **({"venv": svc.venv.name} if svc.venv else {})}


def key_of(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:KEY_LENGTH]


def cache_of(svc: ServicePlan, argv: list[str]) -> EngineCache | None:
    """The service's cache directory for this engine argv (render.engine_cache gives the argv), or None when
    the engine keeps nothing worth keeping (llama.cpp)."""
    spec = svc.engine.caches
    if not spec:
        return None
    inputs = key_inputs(svc, argv)
    root, key = f"{model_root(svc)}/.cache/{svc.engine_name}", key_of(inputs)
    # A venv engine (no mount) reads the cache where it is on the host.
    mounted = f"{root}/{key}" if svc.venv else CONTAINER_DIR
    env = {var: f"{mounted}/{sub}" for var, sub in spec["env"].items()}
    return EngineCache(root=root, key=key, inputs=inputs, env=env, owner=ENGINE_USER if svc.venv else "root")


def docker_flags(cache: EngineCache | None) -> list[str]:
    """The cache directory, read-write (the container is `--rm`: the caches live on the host)."""
    return ["-v", f"{cache.dir}:{CONTAINER_DIR}"] if cache else []


def stale_keys(entries: list[str] | None, in_use: set[str]) -> list[str]:
    """The key directories of an engine's cache root that no service on the host uses now, and the set-aside
    copies whose key directory is gone already (one of a key that stays goes with it)."""
    entries = entries or []
    keys = [e for e in entries if KEY_RE.fullmatch(e) and e not in in_use]
    orphans = [e for e in entries if (m := ASIDE_RE.fullmatch(e)) and m.group(1) not in in_use
               and m.group(1) not in entries]
    return sorted(keys + orphans)


def prune_command(root: str, stale: list[str], keep: int) -> StringCommand:
    """Remove all but the `keep` most recently changed of `stale` (names from stale_keys, all under root), each
    with its key file and its set-aside copy."""
    names = " ".join(shlex.quote(name) for name in stale)
    script = (f"cd {shlex.quote(root)} && ls -dt -- {names} | tail -n +{keep + 1} | "
              f"xargs -r -I@ rm -rf -- @ @{KEY_FILE} @{SET_ASIDE}")
    return StringCommand("sh", "-c", shlex.quote(script))


@operation()
def caches_pruned(root: str, stale: list[str], keep: int):
    """Old cache keys beyond `keep` (a key in use is never among `stale`)."""
    if len(stale) <= keep:
        host.noop(f"{root}: {len(stale)} older cache key(s), keeping up to {keep}")
        return
    yield prune_command(root, stale, keep)
