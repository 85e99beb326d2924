"""Engine readiness: /health answers and /v1/models lists the served name, or show the unit's journal."""

from __future__ import annotations

import shlex

from pyinfra import host, state
from pyinfra.api import FunctionCommand, StringCommand, operation

from modelfleet.base.host_commands import journal_command, program
from modelfleet.host.operations.report import refuse

JOURNAL_LINES = 40


def readiness_script(unit: str, base_url: str, served_name: str, timeout_s: int, auth_file: str | None,
                     health_path: str = "/health") -> str:
    auth = f" -H @{shlex.quote(auth_file)}" if auth_file else ""
    return program("wait_ready", unit, base_url, served_name, int(timeout_s), functions={
        "health": f"curl -fsS -m 5 {shlex.quote(base_url + health_path)}",
        "models": f"curl -fsS -m 5{auth} {shlex.quote(base_url + '/v1/models')}",
        "journal": journal_command(unit, JOURNAL_LINES)})


def worker_script(unit: str, settle_s: int = 10) -> str:
    """A headless worker has no endpoint: it must come up and stay up while the head judges readiness."""
    return program("worker_up", unit, int(settle_s), functions={"journal": journal_command(unit, JOURNAL_LINES)})


@operation(is_idempotent=False)
def worker_up(unit: str):
    """A pool worker's unit started and stayed up (a unit failing on any node fails the pool)."""
    yield StringCommand(worker_script(unit))


@operation(is_idempotent=False)
def wait_ready(unit: str, base_url: str, served_name: str, timeout_s: int, auth_file: str | None = None,
               health_path: str = "/health", on_ready=None):
    """Poll the engine on the host itself (the endpoint is loopback-bound by default). `on_ready`: a
    FunctionCommand body run once it answers (the run's timeline)."""
    yield StringCommand(readiness_script(unit, base_url, served_name, timeout_s, auth_file, health_path))
    if on_ready:
        yield FunctionCommand(on_ready, (), {})


@operation(is_idempotent=False)
def gpus_freed(unit: str, script: str):
    """Before a unit (re)starts: the old engine stopped and every GPU it held free (host_commands.gpus_free_script);
    a process still holding one is named and the unit does not start on top of it."""
    if not state.is_executing:
        host.noop(f"{unit}'s GPUs are asked for held memory before it starts")
        return
    ok, output = host.run_shell_command(StringCommand(script), print_output=False, print_input=False)
    if ok:
        host.noop(f"{unit}: " + " ".join(output.stdout_lines))
        return
    yield FunctionCommand(refuse, ([line.removeprefix("modelfleet: ") for line in output.stderr_lines]
                                   or [f"{unit}: the GPU memory check failed"],), {})


@operation(is_idempotent=False)
def restarts_counted(unit: str):
    """systemd's count of the unit's own restarts set back to 0 once its pool is up (a restart by systemctl keeps
    it): a restart counted after this is a rank that died (units.rank_restarted), not one that retried while the
    pool formed."""
    yield StringCommand("systemctl", "reset-failed", shlex.quote(unit))


@operation()
def flaps_forgotten(path: str):
    """A rank that stayed up since the last converge: the pool restarts it caused in a row start again from 0."""
    yield StringCommand("rm", "-f", "--", shlex.quote(path))


@operation(is_idempotent=False)
def unit_retired(unit: str, path: str):
    """A unit modelfleet wrote under a name its plan does not use: stopped, disabled, its file removed."""
    yield StringCommand("systemctl", "disable", "--now", shlex.quote(unit))
    yield StringCommand("rm", "-f", "--", shlex.quote(path))
    yield StringCommand("systemctl", "daemon-reload")


@operation()
def unit_unmasked(unit: str, masked: bool):
    """A masked unit's links to /dev/null removed (in /etc and /run), before its file is written: an upload
    would go through the link into /dev/null."""
    if not masked:
        host.noop(f"{unit} is not masked")
        return
    yield StringCommand("systemctl", "unmask", "--no-reload", unit)
    yield StringCommand("systemctl", "unmask", "--runtime", "--no-reload", unit)


@operation()
def unit_running(unit: str, current: dict, reload: bool, restart: bool, remove: list[str] | tuple = (),
                 start: bool = True):
    """
    Enabled and active, from the unit's state read before the stage. `reload`: its unit file changed;
    `restart`: something it reads changed. A unit that is started here already runs the new config.
    `remove`: files systemd merges into the unit that modelfleet did not write (drop-ins, a unit file that
    outranks ours), followed by a daemon-reload. `start=False`: enabled only, to start at the next boot (a
    driver daemon before the reboot that loads its driver).
    """
    if remove:
        yield StringCommand("rm", "-f", "--", *(shlex.quote(p) for p in remove))
        for directory in sorted({p.rsplit("/", 1)[0] for p in remove if p.endswith(".conf")}):
            yield StringCommand("rmdir", "--ignore-fail-on-non-empty", "--", shlex.quote(directory))
    if reload or remove:
        yield StringCommand("systemctl", "daemon-reload")
    if current.get("UnitFileState") != "enabled":
        yield StringCommand("systemctl", "enable", unit)
    elif not start:
        host.noop(f"{unit} is enabled (it starts at the next boot)")
    if not start:
        return
    if current.get("ActiveState") == "failed":
        # A re-run is a retry: without this, a unit that hit its start limit refuses to start.
        yield StringCommand("systemctl", "reset-failed", unit)
    if current.get("ActiveState") != "active":
        yield StringCommand("systemctl", "start", unit)
    elif restart:
        # A deliberate restart (its config changed) must not count against the crash-loop start limit.
        yield StringCommand("systemctl", "reset-failed", unit)
        yield StringCommand("systemctl", "restart", unit)
    else:
        host.noop(f"{unit} is enabled and active")
