"""Stop a host with its reasons (the operation fails at execution, so later stages never run there), and write
reports: the one place that decides where a report lands and when it is written (never under `--dry`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pyinfra import logger
from pyinfra.api import FunctionCommand, operation
from pyinfra.api.state import BaseStateCallback
from pyinfra.context import ctx_host, ctx_state

from modelfleet.base import masking, runscope
from modelfleet.base.grammar import slug


def reports_dir(kind: str) -> Path:
    """Where reports of `kind` land on the control node; MODELFLEET_REPORTS moves them all (tests, CI)."""
    return Path(os.environ.get("MODELFLEET_REPORTS", "reports")) / kind


def report_path(kind: str, name: str) -> Path:
    """The report of `kind` about `name` (a host, a pool, an endpoint)."""
    return reports_dir(kind) / f"{slug(name)}.json"


def refuse(state, host, reasons: list[str]) -> bool:
    """FunctionCommand body: log each reason against the host and fail. (pyinfra passes `state` and `host`,
    and uses the return value as the status, only when the function names both.)"""
    for reason in reasons:
        host.log_styled(f"refused: {reason}", fg="red", log_func=logger.error)
    return False


def note(state, host, message: str) -> bool:
    """FunctionCommand body: say something about the host when the run reaches this point, and go on."""
    host.log_styled(message, fg="yellow", log_func=logger.warning)
    return True


@operation(is_idempotent=False)
def note_once(message: str):
    yield FunctionCommand(note, (message,), {})


@operation(is_idempotent=False)
def fail_host(reasons: list[str]):
    yield FunctionCommand(refuse, (reasons,), {})


def save_json(path: str, report: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(masking.mask(json.dumps(masking.masked(report), indent=2)) + "\n")


class _WrittenAfterExecution(BaseStateCallback):
    """Holds reports judged while planning until pyinfra disconnects from their host; only a run that
    executed writes them (a `--dry` run disconnects without executing, so it writes nothing)."""

    def __init__(self) -> None:
        self.pending: dict[str, list[tuple[Path, dict]]] = {}

    def host_disconnect(self, state, host) -> None:
        for path, report in self.pending.pop(host.name, []):
            if state.is_executing:
                save_json(str(path), report)


def save_report(kind: str, name: str, report: dict) -> Path:
    """Write `reports/<kind>/<name>.json`: now when the run executes, else when it ends having executed."""
    path, state = report_path(kind, name), ctx_state.get()
    if state.is_executing:
        save_json(str(path), report)
    else:
        held = runscope.attached("held reports", _WrittenAfterExecution, run=state)
        held.pending.setdefault(ctx_host.get().name, []).append((path, report))
    return path


def _write(state, host, path: str, report: dict) -> bool:
    """FunctionCommand body: runs only when every earlier operation on the host succeeded."""
    save_json(path, report)
    return True


@operation(is_idempotent=False)
def write_report(path: str, report: dict):
    """A JSON report on the control node, written when the run reaches this point on the host (after the
    changes it describes were made)."""
    yield FunctionCommand(_write, (path, report), {})
