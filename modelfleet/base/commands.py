"""pyinfra and modelfleet as child processes, from the environment modelfleet itself runs in.

A virtual environment's bin/ is not always on PATH (`.venv/bin/python lab/demo.py`, an IDE, cron), so a bare
`pyinfra` could start another installation's, or none: both commands run as `python -m` of this interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable, Mapping


def inventory_args(group_data: Iterable[str] = (), data: Iterable[str] = ()) -> list[str]:
    """pyinfra's `--group-data FOLDER` and `--data KEY=VALUE` arguments, in that order."""
    return [*[arg for folder in group_data for arg in ("--group-data", folder)],
            *[arg for pair in data for arg in ("--data", pair)]]


def pyinfra_argv(inventory: str, deploy: str, *, limit: Iterable[str] = (), data: Mapping[str, object] = {},
                 group_data: Iterable[str] = (), extra: Iterable[str] = (), yes: bool = True) -> list[str]:
    return [sys.executable, "-m", "pyinfra", *(["-y"] if yes else []),
            *[arg for name in limit for arg in ("--limit", name)],
            *inventory_args(group_data, (f"{key}={value}" for key, value in data.items())),
            *extra, inventory, deploy]


def run_pyinfra(inventory: str, deploy: str, *, env: Mapping[str, str] | None = None, timeout: float = 900,
                capture: bool = True, cwd: str | None = None, **argv) -> subprocess.CompletedProcess:
    """One pyinfra run; `env` is added to this process's environment."""
    return subprocess.run(pyinfra_argv(inventory, deploy, **argv), env={**os.environ, **(env or {})}, cwd=cwd,
                          capture_output=capture, text=True, timeout=timeout)


def modelfleet_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "modelfleet.cli", *args]


def run_modelfleet(*args: str, env: Mapping[str, str] | None = None, timeout: float = 900,
                   cwd: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(modelfleet_argv(*args), env={**os.environ, **(env or {})}, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)
