"""Retiring what the inventory no longer names: a unit modelfleet wrote on a host (its file starts with
facts.state.OWNED_MARK) that the host's plan does not name any more (a service taken out of `services`, a host
moved out of a pool, a replica taken from a front door, a front door or exporter turned off) is stopped,
disabled and removed with its container and the config and secret files modelfleet wrote beside it; its
checkpoint stays unless a run asks for it to go. A unit a user wrote under a similar name has no mark: it is
never listed, so never touched.

The converge does it in the retire stage (modelfleet.run.stages.retire), after the router stage has taken the
replicas the inventory no longer names out of their front doors; `modelfleet retire` does it for a host that
left the inventory (modelfleet.run.deploys.retire)."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from pyinfra import host
from pyinfra.api import FunctionCommand, StringCommand, operation

from modelfleet.base.commands import pyinfra_argv
from modelfleet.base.grammar import slug
from modelfleet.base.host_commands import revisions_dir
from modelfleet.base.targets import canonical_ip
from modelfleet.host.operations.report import note, report_path, save_json
from modelfleet.host.units import UNIT_DIR, unit_paths
from modelfleet.plan import replica_door, router, venvs
from modelfleet.plan.inventory.plan import HostPlan
from modelfleet.plan.render import CONTAINER_MODEL_DIR, CONTAINER_MODELFILE, DOCKER
from modelfleet.plan.weight_cache import unit_names
from modelfleet.run.stages import exporters

# Where `modelfleet retire` asks the deploy to say what it found on each host (read while planning, so a
# `--dry` run says it too): a folder, one JSON file per host.
PLAN_ENV = "MODELFLEET_RETIRE_PLAN"
# Where `modelfleet retire` tells the deploy what it proved before connecting (JSON: "served", each address of a
# host the inventory still serves -> that host; "proved", each target -> the addresses it resolved to): the deploy
# compares the address pyinfra really connected to before it does anything.
GUARD_ENV = "MODELFLEET_RETIRE_GUARD"
# Set (to 1) by `modelfleet retire --remove-checkpoints`: the retired engines' checkpoints go too.
CHECKPOINTS_ENV = "MODELFLEET_RETIRE_CHECKPOINTS"


@dataclass(frozen=True)
class Retired:
    """A unit modelfleet wrote on a host, as its file says: what it runs, its container, the files modelfleet
    wrote for it, its port and the checkpoint it mounts."""

    unit: str
    what: str
    active: str
    enabled: str
    container: str | None = None
    files: tuple[str, ...] = ()
    port: int | None = None
    checkpoint: str | None = None
    venv: str | None = None  # a venv engine's virtual environment (runtime venv), removed with it

    def line(self, remove_checkpoint: bool = False) -> str:
        parts = [f"modelfleet: retiring {self.unit} ({self.what}; {self.active}, {self.enabled or 'no unit file'})"]
        parts += [f"container {self.container}"] * bool(self.container) + [f"port {self.port}"] * bool(self.port)
        if self.checkpoint:
            gone = remove_checkpoint and removable(self.checkpoint)
            parts.append(f"checkpoint {'removed' if gone else 'kept'} at {revisions_dir(self.checkpoint)}")
        return ", ".join(parts) + ": the inventory no longer names it"


def _exec_lines(text: str) -> dict[str, list[list[str]]]:
    """Each Exec*= key of a unit file with the argv of each of its lines (continuations joined)."""
    out: dict[str, list[list[str]]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.startswith("Exec"):
            try:
                argv = shlex.split(value.lstrip("-"))
            except ValueError:
                continue
            out.setdefault(key, []).append(argv)
    return out


def _after(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv[:-1] else None


def described(unit: str, found: dict) -> Retired:
    """What a unit file modelfleet wrote says about what it runs (found: the DeployedState's `owned` entry)."""
    text = found.get("text") or ""
    execs = _exec_lines(text)
    start = (execs.get("ExecStart") or [[]])[0]
    lines = text.splitlines()
    # The unit's own words: its second comment line (`pool P · recipe ...`, `front door F ...`), else Description.
    said = lines[1][1:].strip() if lines[1:2] and lines[1].startswith("#") else next(
        (line.partition("=")[2] for line in lines if line.startswith("Description=")), "")
    container = next((argv[-1] for argv in execs.get("ExecStartPre", [])
                      if argv[:3] == [DOCKER, "rm", "-f"] and len(argv) == 4), None)
    files: list[str] = []
    checkpoint = None
    settings = dict(line.partition("=")[::2] for line in lines if "=" in line and not line.startswith("#"))
    venv = os.path.dirname(os.path.dirname(start[0])) if start and venvs.is_venv_path(start[0]) else None
    env_file = settings.get("EnvironmentFile") if venv else _after(start, "--env-file")
    if env_file and env_file.endswith(".env"):  # an engine: its env, secrets and client auth files
        stem = env_file[:-len(".env")]
        files += [env_file, f"{stem}.secrets.yaml", f"{stem}.auth"]
        mounts = [v for flag, v in zip(start, start[1:], strict=False) if flag == "-v"]
        checkpoint = settings.get("BindReadOnlyPaths") if venv else next(
            (m.split(":")[0] for m in mounts if m.split(":")[1:2] == [CONTAINER_MODEL_DIR]), None)
        # An engine that registers its checkpoint (Ollama): the Modelfile it is mounted from.
        files += [m.split(":")[0] for m in mounts if m.split(":")[1:2] == [CONTAINER_MODELFILE]]
    config = next((arg for arg in start if arg.endswith(".json") and "/router-" in arg), None)
    if config and unit.startswith("modelfleet-router-"):  # a router: its launcher config, replicas and keys
        base = config[:-len(".json")]
        files += [f"{base}{suffix}" for suffix in router.ROUTER_FILES]
    conf = _after(start, "-c")
    if conf and conf.endswith(".conf") and unit.startswith("modelfleet-door-"):  # nginx: its config and key
        files += [conf, *(conf[:-len(".conf")] + suffix for suffix in router.DOOR_FILES)]
    port = _after(start, "--port")
    return Retired(unit=unit, what=said.split(" · ")[0].split(":")[0] or "a unit modelfleet wrote",
                   active=found.get("ActiveState") or "inactive", enabled=found.get("UnitFileState") or "",
                   container=container, files=tuple(files), port=int(port) if port and port.isdigit() else None,
                   checkpoint=checkpoint, venv=venv)


def named_units(plan: HostPlan) -> set[str]:
    """The units the host's plan names (its services, under their old names too, which the service stage
    retires itself; its front doors; its exporter)."""
    names = {unit for svc in plan.services for unit in unit_names(svc)}
    names |= {svc.legacy_unit_name for svc in plan.services if svc.legacy_unit_name}
    names |= {unit for rp in plan.routers for unit in (rp.unit_name, rp.proxy_unit_name)}
    names |= {replica_door.unit_name(svc) for svc in replica_door.doors(plan)}
    return names | ({exporters.UNIT} if exporters.enabled(plan) else set())


def kept_paths(plan: HostPlan) -> set[str]:
    """Files the plan's own units use: never removed with a retired unit, whatever its file says."""
    paths = {path for svc in plan.services for path in (*unit_paths(svc), svc.auth_file, svc.secrets_config_file)}
    paths |= {svc.venv.path for svc in plan.services if svc.venv}  # a venv another service of the plan runs
    return paths | {path for rp in plan.routers for path in router.paths(rp).values()}


def to_retire(owned: dict[str, dict], named: set[str] = frozenset(), kept: set[str] = frozenset()) -> list[Retired]:
    """The units of `owned` (DeployedState's `owned` of the unit directory) that `named` does not hold."""
    out = []
    for unit in sorted(set(owned) - set(named)):
        found = described(unit, owned[unit])
        out.append(Retired(**{**asdict(found), "files": tuple(p for p in found.files if p not in kept),
                              "venv": found.venv if found.venv not in kept else None}))
    return out


def say_plan(retired: list[Retired], refused: str | None = None) -> None:
    """Where `modelfleet retire` asked (PLAN_ENV): what this host would retire, written while planning (or why
    it refused the host)."""
    folder = os.environ.get(PLAN_ENV)
    if folder:
        Path(folder, f"{slug(host.name)}.json").write_text(json.dumps(
            {"host": host.name, "retired": [asdict(r) for r in retired], "refused": refused}, indent=2) + "\n")


def peer_address() -> str | None:
    """The address pyinfra's SSH connection to this host reached (None: not SSH, or through a proxy, whose
    socket's peer is the proxy)."""
    client = getattr(host.connector, "client", None)
    sock = getattr(client.get_transport(), "sock", None) if client else None
    return canonical_ip(str(sock.getpeername()[0])) if isinstance(sock, socket.socket) else None


def guard_refusal(name: str, peer: str | None, guard: dict) -> str | None:
    """Why this host must not be touched, judged on the address pyinfra really connected to (`guard`: what
    `modelfleet retire` proved before connecting, GUARD_ENV): an address a host of the inventory is reached at
    (a name that resolved elsewhere when checked), or not the address the check resolved this host to."""
    if peer is None:
        return None
    held = guard.get("served", {}).get(peer)
    if held:
        return (f"connected to {peer}, an address of host {held}, which the inventory still serves: nothing "
                "done")
    proved = guard.get("proved", {}).get(name)
    if proved is not None and peer not in proved:
        return (f"connected to {peer}, not an address {name} resolved to when checked ({', '.join(proved)}): "
                "nothing done")
    return None


def guarded() -> str | None:
    """The guard of `modelfleet retire` for the current host (None where no guard was given: a plain pyinfra run
    of the deploy)."""
    path = os.environ.get(GUARD_ENV)
    return guard_refusal(host.name, peer_address(), json.loads(Path(path).read_text())) if path else None


def removable(checkpoint: str | None) -> bool:
    """Only a pinned revision's directory as modelfleet lays it out (<model_root>/<model>/<40-hex commit>) takes
    its model's directory with it; any other mount a unit file names is left where it is."""
    return bool(checkpoint and re.fullmatch(r"/[^\0]+/[^/]+/[0-9a-f]{40}", checkpoint.rstrip("/")))


@operation(is_idempotent=False)
def units_retired(retired: list[Retired], remove_checkpoints: bool = False, kept_venvs: frozenset = frozenset()):
    """
    Each unit stopped and disabled, its container removed, its unit file and the files modelfleet wrote for it
    removed, then one daemon-reload; a line per unit names it, and the host's report (reports/retired/<host>.json)
    records them. Every host of a converge calls this once from the same place, so pyinfra runs it on all of
    them together, after every host's earlier stages: the front doors have forgotten a replica before it stops.
    """
    if not retired:
        host.noop("no unit modelfleet wrote here that the inventory no longer names")
        return
    for r in retired:
        yield FunctionCommand(note, (r.line(remove_checkpoints),), {})
        yield StringCommand("systemctl", "disable", "--now", "--", shlex.quote(r.unit))
        # An engine stopped under `docker run` ends failed: forgotten now, while systemd still has it loaded (a
        # unit systemd never loaded, e.g. written but not yet reloaded, has no failed state to forget).
        yield StringCommand("if", "systemctl", "is-failed", "--quiet", "--", shlex.quote(r.unit), ";", "then",
                            "systemctl", "reset-failed", "--", shlex.quote(r.unit), ";", "fi")
        if r.container:
            name = shlex.quote(r.container)
            yield StringCommand(f"if {DOCKER} container inspect {name} >/dev/null 2>&1; then "
                                f"{DOCKER} rm -f {name} >/dev/null; fi")
        yield StringCommand("rm", "-f", "--", shlex.quote(f"{UNIT_DIR}/{r.unit}"), *map(shlex.quote, r.files))
        if r.venv:  # its venv, and the builds of its engine kept for its rollback that no other unit runs
            yield StringCommand(venvs.retire_command(r.venv, kept_venvs))
        if remove_checkpoints and removable(r.checkpoint):
            yield StringCommand("rm", "-rf", "--", shlex.quote(revisions_dir(r.checkpoint)))
    yield StringCommand("systemctl", "daemon-reload")
    report = {"host": host.name, "retired": [{**asdict(r), "checkpoint_removed": bool(
        remove_checkpoints and removable(r.checkpoint))} for r in retired]}
    yield FunctionCommand(_recorded, (str(report_path("retired", host.name)), report), {})


def _recorded(state, host, path: str, report: dict) -> bool:
    """FunctionCommand body: the report, once the units are gone."""
    save_json(path, report)
    return True


def _connect_error(output: str, name: str) -> str | None:
    """pyinfra's own line for a host it could not connect to (`[NAME] Could not connect (...)`)."""
    said = [line.strip().removeprefix(f"[{name}]").strip() for line in output.splitlines()
            if line.strip().startswith(f"[{name}] ")]
    return said[-1] if said else None


def run(targets: list, served: dict, deploy_file: str, dry: bool, remove_checkpoints: bool,
        pyinfra_options: list[str]) -> dict:
    """The retire deploy (`deploy_file`: modelfleet.run.deploys.retire's, which imports this module) over pyinfra on
    the targets (modelfleet.base.targets.Target, checked: each handed to pyinfra as its one spelling), with the guard
    (`served`: modelfleet.base.targets.served of the inventory); what each host retired (or, dry, would retire), read
    from what the deploy wrote while planning. A target that resolved to nothing is not handed to pyinfra; it
    and any host the deploy did not plan on (unreachable, refused) make the run not ok."""
    reachable = [t for t in targets if not t.unresolved]
    found, refused, done = {}, {}, None
    if reachable:
        with tempfile.TemporaryDirectory(prefix="modelfleet-retire-") as folder:
            guard = Path(folder, "guard")
            guard.mkdir()
            (guard / "guard.json").write_text(json.dumps({
                "served": {ip: name for name, (_, ips) in served.items() for ip in sorted(ips)},
                "proved": {t.pyinfra: sorted(t.addresses) for t in reachable if t.pyinfra.startswith("@ssh/")}}))
            env = {**os.environ, PLAN_ENV: folder, GUARD_ENV: str(guard / "guard.json"),
                   CHECKPOINTS_ENV: "1" if remove_checkpoints else "0"}
            argv = pyinfra_argv(",".join(t.pyinfra for t in reachable), deploy_file,
                                extra=[*pyinfra_options, *["--dry"] * dry])
            done = subprocess.run(argv, env=env, capture_output=True, text=True)
            for entry in (json.loads(p.read_text()) for p in Path(folder).glob("*.json")):
                (refused if entry.get("refused") else found)[entry["host"]] = entry.get("refused") or entry["retired"]
    rows = []
    for t in targets:
        row = {"host": t.given, "retired": found.get(t.pyinfra)}
        if t.unresolved:
            row["error"] = f"not reached: {t.unresolved}"
        elif t.pyinfra in refused:
            row["error"] = f"refused: {refused[t.pyinfra]}"
        elif row["retired"] is None:
            row["error"] = "not reached: " + (_connect_error(done.stdout + done.stderr, t.pyinfra) or
                                              "see pyinfra's output")
        rows.append(row)
    ok = (done is None or done.returncode == 0) and not any("error" in row for row in rows)
    return {"dry": dry, "ok": ok, "checkpoints_removed": remove_checkpoints and not dry, "hosts": rows,
            "output": (done.stdout + done.stderr) if done else ""}
