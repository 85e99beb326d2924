"""The restart tier (docs/restart-tier.md): a weight-cache unit beside a pool's engine, where its engine version has
one (catalog/engines.yaml `weight_cache`). The daemon holds each rank's loaded shard in GPU memory and hands it to
the engine over CUDA IPC, so a restarted engine maps its weights instead of loading them.

What it is called, where its sockets live, the client flags the engine gains and the daemon's own command line,
and its key: model, revision, the engine flags that shape a rank's shard, the engine version. Pure (the unit is
rendered by modelfleet.plan.render, written with the engine's by units.unit_files)."""

from __future__ import annotations

import hashlib
import json
import shlex

from modelfleet.base import grammar
from modelfleet.base.host_commands import MANIFEST
from modelfleet.plan import engine_flags
from modelfleet.plan.catalog import Engine, Recipe, WeightCache

# The host's directory of the sockets, one folder per pool (0700, created by systemd: RuntimeDirectory of both
# units), and where both containers see it.
SOCKETS_ROOT = "/run/modelfleet/weights"
CONTAINER_SOCKETS = "/run/modelfleet-weights"
# The daemons' own rendezvous in a pool across hosts (vLLM: --weight-cache-master-port; SGLang:
# --dist-init-method), apart from the engine's torch.distributed master port (render.MASTER_PORT).
MASTER_PORT = 29510


def version_tuple(text: str) -> tuple[int, ...] | None:
    """`0.34.0` -> (0, 34, 0); None for a version that is not dotted numbers (llama.cpp's `b11434`)."""
    parts = text.lstrip("v").split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else None


def refusal(engine_name: str, engine: Engine, recipe: Recipe, extra_args=()) -> str | None:
    """Why the service cannot have the restart tier (None: it can): its engine version has none, or its
    `extra_args` set a flag the client flags set."""
    spec = engine.weight_cache
    if spec is None:
        return f"{engine_name} has no weight cache (no restart tier): take `weight_cache` out"
    have, since = version_tuple(recipe.engine_version), version_tuple(spec.since)
    if have is None or since is None or have < since:
        return (f"recipe {recipe.id} runs {engine_name} {recipe.engine_version}, which has no weight cache (it is "
                f"read in {engine_name} {spec.since} and later): take `weight_cache` out or use a newer recipe")
    clash = sorted(_client_flags(spec, engine_name, engine.flag_parser) &
                   {o for a in extra_args for o in engine_flags.reads_as(engine_name, engine.flag_parser, a)})
    if clash:
        return f"extra_args set {', '.join(clash)}, which the weight cache's client sets: take one of them out"
    return None


def _client_flags(spec: WeightCache, engine_name: str, parser: str) -> set[str]:
    """The options the client flags set, as the engine's parser reads them."""
    return {o for a in spec.engine_args for o in engine_flags.reads_as(engine_name, parser, a)}


def displaced(svc, args) -> tuple[list[str], list[str]]:
    """The recipe's args split in two: what the engine keeps, and the flags (with their values) the client flags
    replace, which go to the daemon, the one that loads from disk now (a recipe's `--load-format
    fastsafetensors` is how it loads)."""
    cache = spec(svc)
    if cache is None:
        return list(args), []
    name, parser = svc.engine_name, svc.engine.flag_parser
    kept, moved, client, skip = [], [], _client_flags(cache, name, parser), False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if engine_flags.reads_as(name, parser, arg) & client:
            following = args[i + 1] if i + 1 < len(args) else None
            skip = "=" not in arg and following is not None and grammar.flag_name(following) is None
            moved += [arg] + ([following] if skip else [])
        else:
            kept.append(arg)
    return kept, moved


def spec(svc) -> WeightCache | None:
    """The service's restart tier: its engine's, when the service turns it on (validation refused the rest)."""
    return svc.engine.weight_cache if svc.weight_cache else None


def unit_name(svc) -> str:
    return svc.unit_name.removesuffix(".service") + "-weights.service"


def unit_names(svc) -> list[str]:
    """The service's units: its engine's, and its weight cache's where it has one."""
    return [svc.unit_name] + ([unit_name(svc)] if spec(svc) else [])


def container_name(svc) -> str:
    return f"{svc.container_name}-weights"


def env_file(svc) -> str:
    return f"{svc.config_dir}/{svc.pool}-weights.env"


def runtime_directory(svc) -> str:
    """systemd's RuntimeDirectory= (relative to /run) of the pool's sockets."""
    return f"{SOCKETS_ROOT.removeprefix('/run/')}/{svc.pool}"


def runtime_directories(svc) -> str:
    """RuntimeDirectory= of both units: the sockets' folder and each parent, so systemd makes every one 0700 (it
    makes unlisted parents 0755, and /run/modelfleet holds the run lock, which wants it 0700)."""
    parts = runtime_directory(svc).split("/")
    return " ".join("/".join(parts[:i]) for i in range(1, len(parts) + 1))


def socket_dir(svc) -> str:
    return f"/run/{runtime_directory(svc)}"


def verified_check(svc) -> str:
    """Shell: the folder the daemon loads is the pinned revision's, a real directory holding the manifest of a
    verified copy (host_commands.MANIFEST), else one line naming it and exit 1 (the engine then loads from disk,
    and the verify gate says so)."""
    return (f"f={shlex.quote(svc.model_dir)}; test -d \"$f\" && ! test -L \"$f\" && test -f \"$f/{MANIFEST}\" || "
            f"{{ echo \"modelfleet: weight cache of pool {svc.pool}: $f is not a verified checkpoint of revision "
            f"{svc.revision} (no {MANIFEST} there): not loading it\" >&2; exit 1; }}")


def _filled(text: str, **values) -> str:
    """Placeholders replaced by name (not str.format: vLLM's loader config is JSON, braces and all)."""
    for name, value in values.items():
        text = text.replace("{" + name + "}", str(value))
    return text


def engine_args(svc) -> list[str]:
    """What the engine's argv gains: the client flags, fallback on (a missing daemon costs a disk load)."""
    cache = spec(svc)
    return [_filled(a, socket_dir=CONTAINER_SOCKETS) for a in cache.engine_args] if cache else []


def env(svc) -> dict[str, str]:
    """What both containers' environments gain (SGLang finds each GPU's socket from a template)."""
    cache = spec(svc)
    return {k: _filled(v, socket_dir=CONTAINER_SOCKETS) for k, v in cache.env.items()} if cache else {}


def shard_args(svc, engine_argv: list[str]) -> list[str]:
    """The engine argv's flags that shape a rank's shard (the catalog's `shard_flags`, in the engine's spelling
    as written), each with its value when it has one."""
    wanted = set(spec(svc).shard_flags)
    out: list[str] = []
    for i, arg in enumerate(engine_argv):
        name = grammar.flag_name(arg)
        if name is None or name not in wanted:
            continue
        out.append(arg)
        following = engine_argv[i + 1] if i + 1 < len(engine_argv) else None
        if "=" not in arg and following is not None and grammar.flag_name(following) is None:
            out.append(following)
    return out


def daemon_argv(svc, engine_argv: list[str], model_path: str, head: str) -> list[str]:
    """The daemon's command line after its entrypoint: the catalog's, the shard flags, its own rendezvous in a
    pool across hosts."""
    cache = spec(svc)
    argv = [_filled(a, model_path=model_path, socket_dir=CONTAINER_SOCKETS) for a in cache.daemon_argv]
    argv += shard_args(svc, engine_argv) + displaced(svc, svc.recipe.args)[1]
    if svc.nnodes > 1:
        argv += [_filled(a, head=head, port=MASTER_PORT) for a in cache.daemon_multinode]
    return argv


def key(svc, engine_argv: list[str]) -> dict:
    """What the cached weights are: a change of any of it restarts the daemon (new weights); anything else (the
    image, the engine's other flags, its env) leaves it running."""
    return {"model": svc.model.id, "revision": svc.revision, "model_file": svc.model_file,
            "engine": svc.engine_name, "engine_version": svc.recipe.engine_version,
            "shard": shard_args(svc, engine_argv), "gpus": list(svc.gpu_indices), "nnodes": svc.nnodes,
            "node_rank": svc.node_rank}


def key_hash(svc, engine_argv: list[str]) -> str:
    return hashlib.sha256(json.dumps(key(svc, engine_argv), sort_keys=True).encode()).hexdigest()[:16]
