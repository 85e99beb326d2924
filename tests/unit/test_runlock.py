"""The run lock on a host reached through the local connector: a second run is refused with the holder named,
the lock goes with the run that held it, and a dead run of this control node is taken over (what the host
program refuses to follow or kill: tests/unit/test_run_lock.py)."""

import os
import subprocess
from types import SimpleNamespace

import pytest

from modelfleet.run import runlock


class LocalConnector:  # what runlock recognises: pyinfra's @local connector, by class name
    pass


class Run:  # a pyinfra State stands for a run; any weak-referenceable object will do here
    pass


def lock_host(tmp_path, monkeypatch) -> SimpleNamespace:
    """A host reached through the local connector, its lock directory under `tmp_path`."""
    monkeypatch.setattr(runlock, "LOCK_DIR", str(tmp_path / "modelfleet"))
    return SimpleNamespace(name="h1", connector=LocalConnector())


@pytest.fixture
def lock_in(tmp_path, monkeypatch):
    return lock_host(tmp_path, monkeypatch)


def end(*runs):
    for run in runs:
        for handle in runlock.holding(run).values():
            handle.stdin.close()
            handle.wait(timeout=10)


def orphan_holding(lock_in, monkeypatch) -> Run:
    """A run whose control-node process is gone while its holder on the host still holds the lock."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    real_record = runlock.holder_record
    monkeypatch.setattr(runlock, "holder_record", lambda: {**real_record(), "pid": dead.pid})
    orphan = Run()
    assert runlock.acquire(orphan, lock_in)[0]
    monkeypatch.setattr(runlock, "holder_record", real_record)
    return orphan


def test_a_second_run_is_refused_naming_the_holder_and_the_lock_goes_with_the_run(lock_in):
    first, second = Run(), Run()
    assert runlock.acquire(first, lock_in) == (True, "")
    taken, message = runlock.acquire(second, lock_in)
    assert not taken and f"pid {os.getpid()}" in message and "holds this host" in message
    end(first)  # the first run ends: its holder process goes
    assert runlock.acquire(second, lock_in) == (True, "")
    end(second)
    mode = os.stat(runlock.LOCK_DIR).st_mode & 0o777
    assert mode == 0o700 and os.stat(runlock.lock_path()).st_mode & 0o777 == 0o600


def test_a_dead_run_of_this_control_node_is_taken_over(lock_in, monkeypatch):
    orphan = orphan_holding(lock_in, monkeypatch)
    fresh = Run()
    taken, message = runlock.acquire(fresh, lock_in)
    assert taken and "took over" in message, message
    assert runlock.holding(orphan)["h1"].wait(timeout=10) != 0  # its holder was signalled, not left behind
    end(fresh)
