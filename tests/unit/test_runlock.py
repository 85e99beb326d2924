"""The run lock on a host reached through the local connector: a second run is refused with the holder named,
the lock goes with the run that held it, and a dead run of this control node is taken over."""

import os
import subprocess
from types import SimpleNamespace

import pytest

from modelfleet import runlock


class LocalConnector:  # what runlock recognises: pyinfra's @local connector, by class name
    pass


class Run:  # a pyinfra State stands for a run; any weak-referenceable object will do here
    pass


@pytest.fixture
def lock_in(tmp_path, monkeypatch):
    monkeypatch.setattr(runlock, "LOCK", str(tmp_path / "modelfleet.lock"))
    monkeypatch.setattr(runlock, "HOLDER", str(tmp_path / "modelfleet.lock.holder"))
    return SimpleNamespace(name="h1", connector=LocalConnector())


def test_a_second_run_is_refused_naming_the_holder_and_the_lock_goes_with_the_run(lock_in):
    first, second = Run(), Run()
    assert runlock.acquire(first, lock_in) == (True, "")
    taken, message = runlock.acquire(second, lock_in)
    assert not taken and f"pid {os.getpid()}" in message and "holds this host" in message
    for handle in runlock.holding(first).values():  # the first run ends: its holder process goes
        handle.stdin.close()
        handle.wait(timeout=10)
    assert runlock.acquire(second, lock_in) == (True, "")


def test_a_dead_run_of_this_control_node_is_taken_over(lock_in, monkeypatch):
    dead = subprocess.Popen(["true"])
    dead.wait()
    real_record = runlock.holder_record
    monkeypatch.setattr(runlock, "holder_record", lambda: {**real_record(), "pid": dead.pid})
    orphan = Run()
    assert runlock.acquire(orphan, lock_in)[0]  # its holder records a control-node pid that no longer runs
    monkeypatch.setattr(runlock, "holder_record", real_record)
    fresh = Run()
    taken, message = runlock.acquire(fresh, lock_in)
    assert taken and "took over" in message, message
    for run in (orphan, fresh):
        for handle in runlock.holding(run).values():
            handle.stdin.close()
            handle.wait(timeout=10)
