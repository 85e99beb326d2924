"""One modelfleet run per host at a time.

The lock is an flock on the host (/run/modelfleet/run.lock, in a directory only root can write: nobody else can
plant a symlink, a FIFO or a lock there) held by a process attached to its own SSH channel of the run's
connection: it lives exactly as long as the control node's run. When the run ends, or the control node dies
(its sockets close with it), sshd closes the channel, the holder exits and the kernel drops the lock; a reboot
clears /run. So a second run meets a busy lock only while the first really runs, and is told who holds it. The
one stale case, a connection left half-open by a control node that vanished without closing it, is taken over
when the holder recorded this very control node (same machine and boot) with a process that no longer exists;
the host then signals its holder only after checking that the pid it recorded holds the lock now with the
start time it recorded (modelfleet/files/run_lock.py).
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import time
from pathlib import Path

from modelfleet import FILES_DIR
from modelfleet.base import runscope, sudo

LOCK_DIR = "/run/modelfleet"
PROGRAM = FILES_DIR / "run_lock.py"


def lock_path() -> str:
    return f"{LOCK_DIR}/run.lock"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def holder_record() -> dict:
    return {"control_node": socket.gethostname(), "pid": os.getpid(), "boot_id": _boot_id(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def hold_script(record: dict, stale: dict | None = None) -> str:
    """Take the lock or say who has it (`busy <remote pid> <json>`), then keep it until stdin closes; with
    `stale`, the dead run's record, the host takes the lock over from its verified holder (files/run_lock.py)."""
    args = [LOCK_DIR, json.dumps(record), *([json.dumps(stale)] if stale else [])]
    return " ".join(["python3", "-c", shlex.quote(PROGRAM.read_text()), *map(shlex.quote, args)])


def parse_busy(reply: str) -> dict:
    """The holder from a `busy` reply: its record, with `remote_pid`."""
    remote_pid, _, record = reply.removeprefix("busy").strip().partition(" ")
    try:
        holder = json.loads(record) if record else {}
    except ValueError:
        holder = {}
    return {**holder, "remote_pid": remote_pid} if remote_pid.isdigit() else holder


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def is_stale(holder: dict) -> bool:
    """The holder is a run of this control node (same machine, same boot) whose process is gone."""
    return (holder.get("control_node") == socket.gethostname() and holder.get("boot_id") == _boot_id()
            and isinstance(holder.get("pid"), int) and not _pid_alive(holder["pid"]))


def describe(holder: dict) -> str:
    if not holder:
        return "another modelfleet run (holder unknown)"
    return (f"another modelfleet run: pid {holder.get('pid')} on control node {holder.get('control_node')}, "
            f"since {holder.get('since')}")


def _open_ssh(client, script: str, password: str | None):
    channel = client.get_transport().open_session()
    channel.exec_command(script)
    if password:
        channel.sendall((password + "\n").encode())
    reply = channel.makefile("r").readline().strip()
    return channel, reply


def _open_local(script: str, password: str | None):
    proc = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if password:
        proc.stdin.write(password + "\n")
        proc.stdin.flush()
    return proc, (proc.stdout.readline() or "").strip()


def _release(handle) -> None:
    if isinstance(handle, subprocess.Popen):
        handle.stdin.close()
        handle.wait(timeout=10)
    else:
        handle.close()


def holding(run_state) -> dict:
    """The locks this run holds: host name -> the channel or process that holds it (it goes with the run)."""
    return runscope.slot("run locks", dict, run=run_state)


def acquire(run_state, host) -> tuple[bool, str]:
    """(taken, message) for `host` in this run; hosts with no shell of their own (@fake) need no lock."""
    held = holding(run_state)
    if host.name in held:
        return True, ""
    connector = type(host.connector).__name__
    client = getattr(host.connector, "client", None)
    if client is None and connector != "LocalConnector":
        return True, ""
    record, stale = holder_record(), None
    # As root: through sudo where the run uses it, its password on stdin, never on the host's command line.
    words, password = sudo.prefix(host) if hasattr(host, "data") else ([], None)
    for attempt in (1, 2):
        script = " ".join([*words, hold_script(record, stale)])
        handle, reply = _open_ssh(client, script, password) if client is not None else _open_local(script, password)
        if reply == "locked":
            held[host.name] = handle
            return True, ("took over the lock of a run of this control node that died" if stale else "")
        _release(handle)
        if not reply.startswith("busy"):
            return False, f"could not take the run lock {lock_path()}: {reply or 'no answer (is python3 there?)'}"
        holder = parse_busy(reply)
        if attempt == 1 and is_stale(holder):
            stale = {k: v for k, v in holder.items() if k != "remote_pid"}
            continue
        return False, f"{describe(holder)} holds this host ({lock_path()}); wait for it to finish"
    return False, "could not take the run lock"
