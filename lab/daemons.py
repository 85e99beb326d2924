"""Background services of the lab (registry, apt repository, hub double): started once, found by pidfile."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

# Which lab this is (0: the user's; the tests run N=1 beside it): it shifts every address and port.
NET = int(os.environ.get("MODELFLEET_LAB_NET", "0"))


def port_open(listen: str) -> bool:
    """Does something accept connections on `listen` (host:port)?"""
    host, port = listen.rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, int(port))) == 0


def running(state: Path, name: str) -> bool:
    """Is the service this lab started (its pidfile's process group) still alive?"""
    try:
        os.killpg(int((state / f"{name}.pid").read_text()), 0)
        return True
    except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
        return False


def start(state: Path, name: str, argv: list[str], listen: str, env: dict | None = None) -> None:
    """Start `argv` in its own session unless this lab's own service already answers on `listen` (host:port).
    Something else on the address (another checkout's lab, a site's own registry) is refused, not used: it
    would serve another lab's keys and files."""
    if port_open(listen):
        if running(state, name):
            return
        raise RuntimeError(f"lab {name}: {listen} is held by a process this lab ({state}) did not start; "
                           "stop it (`modelfleet lab down` in the checkout that started it) or give this lab "
                           "its own addresses with MODELFLEET_LAB_NET=N")
    log = open(state / f"{name}.log", "a")
    proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, **(env or {})})
    (state / f"{name}.pid").write_text(str(proc.pid))
    for _ in range(150):
        if port_open(listen):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise RuntimeError(f"lab {name} did not start on {listen}; see {state / f'{name}.log'}")


def stop(state: Path, name: str) -> bool:
    """Stop the service this lab started under `name` (its whole process group); False: none was running."""
    pidfile = state / f"{name}.pid"
    if not pidfile.exists():
        return False
    try:
        pid = int(pidfile.read_text())
        os.killpg(pid, signal.SIGTERM)
        wait_gone(pid)
        stopped = True
    except (ProcessLookupError, ValueError):
        stopped = False
    pidfile.unlink()
    return stopped


def stop_all(state: Path) -> list[str]:
    """Stop every service this lab started (its whole process group); returns their names."""
    return [pidfile.stem for pidfile in sorted(state.glob("*.pid")) if stop(state, pidfile.stem)]


def wait_gone(pid: int, timeout_s: float = 5) -> None:
    """Reap it if it is our child; SIGKILL its group if it outlives the timeout."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:  # not ours (started by an earlier `lab up`): watch the group instead
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                return
        time.sleep(0.1)
    os.killpg(pid, signal.SIGKILL)
