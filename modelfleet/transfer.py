"""Verified files from one host to another: the fetch script on the host (files/modelfleet_fetch.py), its
read-only peer server as a transient unit, and the waves in which holders serve the hosts that lack a copy.
The checkpoint fan-out (stage model) and the engine caches' (stage engine_cache) both move their files so."""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import FunctionCommand, StringCommand, operation

from modelfleet.grammar import slug
from modelfleet.operations.report import note, refuse
from modelfleet.stages import TOOLS_BIN

FETCH = f"{TOOLS_BIN}/modelfleet_fetch.py"
VENV = "/opt/modelfleet/hf-venv"  # the hub client the fetch script downloads with
FANOUT_PORT = 18431
# The peer server's lifetime: the group's missing bytes at this floor rate, plus a margin. A control node
# killed mid-copy cannot stop it; this bounds it, and the next run stops a leftover before starting its own.
FANOUT_FLOOR_BYTES_S = 25e6
FANOUT_MARGIN_S = 300


def _fetch_command(job: str, mode: str, source: str | None, reverify: bool,
                   source_host: str | None = None) -> StringCommand:
    python = f"{VENV}/bin/python" if mode == "hub" else "python3"
    argv = [python, FETCH, job, mode] + ([source] if source else []) + (["--reverify"] if reverify else [])
    argv += [f"--source-name={source_host}"] if source_host else []
    return StringCommand(*map(shlex.quote, argv))


def _source_alive(state, host, source: str) -> bool:
    """FunctionCommand body, at execution time: a peer whose source host already failed in this run says so
    in one line instead of timing out against a server that never started."""
    if any(failed.name == source for failed in state.failed_hosts):
        return refuse(state, host, [f"copy source {source} failed earlier in this run (see its error): "
                                    "nothing to copy from; fix it and re-run"])
    return True


@operation(is_idempotent=False)
def checkpoint_fetched(job: str, mode: str, source: str | None, missing: list[str], reverify: bool,
                       source_host: str | None = None):
    """Run the fetch script: it re-checks what is present, fetches `missing` and what fails its hash."""
    if not missing:
        host.noop("checkpoint complete (manifest, sizes and mtimes match)")
        return
    if source_host:
        yield FunctionCommand(_source_alive, (source_host,), {})
    yield _fetch_command(job, mode, source, reverify, source_host)


def fanout_unit(group: str) -> str:
    return f"modelfleet-fanout-{slug(group, '-')}"


@operation(is_idempotent=False)
def fanout_serving(group: str, directory_: str, address: str, port: int, serve: bool, needed: bool,
                   lifetime_s: int = 0, leftover: bool = False, rate_mb_s: int | None = None):
    """A transient unit serving the verified copy to the group's peers (read-only HTTP) for at most
    `lifetime_s`, or stop it. A unit left running by an earlier run that died is stopped first."""
    unit = fanout_unit(group)
    if serve and leftover:  # whether or not this run serves: the run that started it is gone (the run lock)
        yield FunctionCommand(note, (f"stopping {unit}, left running by an earlier run that did not finish",), {})
        yield StringCommand("systemctl", "stop", shlex.quote(unit), "||", "true")
        yield StringCommand("systemctl", "reset-failed", shlex.quote(unit), "2>/dev/null", "||", "true")
    if not needed:
        if not (serve and leftover):
            host.noop("no peer needs a copy from this host")
        return
    if serve:
        argv = ["systemd-run", f"--unit={unit}", f"--property=RuntimeMaxSec={lifetime_s}", "--collect",
                "python3", FETCH, "serve", directory_, address, str(port), *([str(rate_mb_s)] if rate_mb_s else [])]
        yield StringCommand(*map(shlex.quote, argv))
        url = shlex.quote(f"http://{address}:{port}/")
        wait = (f"for i in $(seq 50); do curl -fsS -o /dev/null {url} && exit 0; sleep 0.2; done; "
                f"echo 'fan-out server did not start' >&2; exit 1")
        yield StringCommand("sh", "-c", shlex.quote(wait))
    else:
        # A server that already ended (its lifetime, its host restarted) left nothing to stop: say nothing.
        yield StringCommand("sh", "-c", shlex.quote(f"systemctl is-active --quiet {shlex.quote(unit)} || exit 0; "
                                                    f"systemctl stop {shlex.quote(unit)}"))


def fanout_waves(members: list[str], holders: set[str], width: int) -> list[dict[str, str]]:
    """Who copies from whom, wave by wave ({target: source} each): every holder serves at most `width` of the
    members still missing per wave, and those served become holders for the next wave. Wave k reaches
    (1 + width)^k holders, so N hosts take about log(N) waves and no host serves more than `width` at once.
    The newest holders are asked first: a short last wave spares the seed, which also fetched from the hub."""
    sources = [name for name in members if name in holders]
    waiting = [name for name in members if name not in holders]
    waves = []
    while waiting and sources:
        wave = {}
        for source in reversed(sources):
            for target in waiting[:width]:
                wave[target] = source
            waiting = waiting[width:]
        waves.append(wave)
        sources += list(wave)
    return waves
