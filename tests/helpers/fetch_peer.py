"""The fetch script's peer server as its unit runs it, for the tests of the fetch script and of the swarm built on
it: the script's path, a free loopback port, the run's token and a serving host's proof key."""

import json
import socket
import subprocess
import sys
import time

from modelfleet import FILES_DIR
from tests.helpers.listener import free_port

FETCH = str(FILES_DIR / "modelfleet_fetch.py")
TOKEN = "5e" * 32
KEY = "7a" * 32  # the serving host's proof key (gpu-01's), as the control node makes one per host
NAME = "gpu-01"


def serving(directory, *rate: str, files=None, port=None, name=NAME, key=KEY, **extra):
    """The peer server as the unit runs it: its job on stdin. Started when its challenge is answered."""
    port = port or free_port()
    files = files if files is not None else [str(p.relative_to(directory)) for p in directory.rglob("*")
                                             if p.is_file()]
    job = {"dir": str(directory), "address": "127.0.0.1", "port": port, "token": TOKEN, "files": files,
           "rate_mb_s": float(rate[0]) if rate else None, "name": name, "proof_key": key, **extra}
    proc = subprocess.Popen([sys.executable, FETCH, "serve"], stdin=subprocess.PIPE)
    proc.stdin.write(json.dumps(job).encode())
    proc.stdin.close()
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}/"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("the peer server did not start")
