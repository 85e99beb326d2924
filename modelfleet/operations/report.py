"""Stop a host with its reasons (the operation fails at execution, so later stages never run there), and write
reports when the run reaches a point on a host."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pyinfra import logger
from pyinfra.api import FunctionCommand, operation


def reports_dir(kind: str) -> Path:
    """Where reports of `kind` land on the control node; MODELFLEET_REPORTS moves them all (tests, CI)."""
    return Path(os.environ.get("MODELFLEET_REPORTS", "reports")) / kind


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
    Path(path).write_text(json.dumps(report, indent=2) + "\n")


def _write(state, host, path: str, report: dict) -> bool:
    """FunctionCommand body: runs only when every earlier operation on the host succeeded."""
    save_json(path, report)
    return True


@operation(is_idempotent=False)
def write_report(path: str, report: dict):
    """A JSON report on the control node, written when the run reaches this point on the host (after the
    changes it describes were made)."""
    yield FunctionCommand(_write, (path, report), {})
