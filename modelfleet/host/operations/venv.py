"""The venv engine's host side (runtime venv, docs/venv.md): its user, its venv built from the lock (and the
wheelhouse's files pushed first), the venvs no service uses pruned beyond the one kept for rollback."""

from __future__ import annotations

import os
import shlex

from pyinfra import host
from pyinfra.api import FileUploadCommand, StringCommand, operation

from modelfleet.plan import venvs
from modelfleet.plan.venvs import VenvPlan


@operation()
def engine_user(present: bool):
    """The system user every venv engine runs as: no login, no home, its own group."""
    if present:
        host.noop(f"user {venvs.ENGINE_USER} exists")
        return
    user = venvs.ENGINE_USER
    yield StringCommand(f"getent group {user} >/dev/null || groupadd --system {user}; "
                        f"getent passwd {user} >/dev/null || useradd --system --gid {user} --no-create-home "
                        f"--home-dir /nonexistent --shell /usr/sbin/nologin {user}")


@operation()
def venv_built(venv: VenvPlan, built: bool):
    """The venv at its path, finished (its marker); else the lock (and the wheelhouse's files the lock names)
    pushed to a fresh root-only staging directory and the venv built from them (venvs.build_command)."""
    if built:
        host.noop(f"venv {venv.path} is built")
        return
    staging = shlex.quote(venv.staging)
    yield StringCommand(f"install -d -m 0755 -o root -g root {venvs.VENV_ROOT} && install -d -m 0700 -o root -g root "
                        f"{venvs.WHEELHOUSE_ROOT} && rm -rf --one-file-system {staging} && "
                        f"mkdir -m 0700 {staging}")
    yield FileUploadCommand(venv.lock_file, f"{venv.staging}/requirements.txt")
    for name in venv.wheels:
        yield FileUploadCommand(os.path.join(venv.wheelhouse, name), f"{venv.staging}/{name}")
    yield StringCommand(venvs.build_command(venv))


@operation()
def venvs_pruned(entries: list[str] | None, in_use: set[str]):
    """Venvs beyond the one kept for rollback per engine, and unfinished builds, that no service uses."""
    if not venvs.prune_wanted(entries, in_use):
        host.noop(f"{venvs.VENV_ROOT} keeps only venvs in use and one for rollback")
        return
    yield StringCommand(venvs.prune_command(in_use))
