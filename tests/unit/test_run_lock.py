"""The run lock's holder on a host (modelfleet/files/run_lock.py), as an attacker meets it: a pid planted in the
holder file is never killed, a lock directory that is not private is refused and not followed, a symlink or a
FIFO at the lock is refused at once (nothing is written through it, nothing waits on it)."""

import json
import os
import subprocess

import pytest

from modelfleet.files import run_lock
from modelfleet.run import runlock
from tests.unit.test_runlock import Run, end, lock_host, orphan_holding


@pytest.fixture
def lock_in(tmp_path, monkeypatch):
    return lock_host(tmp_path, monkeypatch)


def test_a_pid_planted_in_the_holder_file_is_never_killed(lock_in, monkeypatch):
    orphan = orphan_holding(lock_in, monkeypatch)
    holder_file = f"{runlock.LOCK_DIR}/{run_lock.HOLDER}"
    holder = json.load(open(holder_file))
    victim = subprocess.Popen(["sleep", "60"])
    try:
        for planted in ({**holder, "pid": victim.pid, "start": run_lock.start_time(victim.pid)},  # not the holder
                        {**holder, "start": "1"}):  # the holder's pid, another start time: a recycled pid
            json.dump(planted, open(holder_file, "w"))
            taken, message = runlock.acquire(Run(), lock_in)
            assert not taken and "holds this host" in message, message
            assert victim.poll() is None and runlock.holding(orphan)["h1"].poll() is None
    finally:
        victim.kill()
        end(orphan)


def test_a_lock_directory_that_is_not_private_is_refused_and_not_followed(lock_in, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, runlock.LOCK_DIR)
    taken, message = runlock.acquire(Run(), lock_in)
    assert not taken and "is not a directory of uid" in message and runlock.LOCK_DIR in message
    assert list(elsewhere.iterdir()) == []
    os.unlink(runlock.LOCK_DIR)
    os.mkdir(runlock.LOCK_DIR, 0o755)
    os.chmod(runlock.LOCK_DIR, 0o777)  # anyone could have put a name in it
    taken, message = runlock.acquire(Run(), lock_in)
    assert not taken and "mode 0700" in message and os.listdir(runlock.LOCK_DIR) == []


@pytest.mark.parametrize("plant", ["symlink", "fifo"])
def test_a_symlink_or_fifo_at_the_lock_is_refused_at_once(lock_in, tmp_path, plant):
    os.mkdir(runlock.LOCK_DIR, 0o700)
    target = tmp_path / "target"
    if plant == "symlink":
        os.symlink(target, runlock.lock_path())
    else:
        os.mkfifo(runlock.lock_path())  # opened without O_NONBLOCK, the holder would wait here forever
    taken, message = runlock.acquire(Run(), lock_in)
    assert not taken and "is not a regular file" in message, message
    assert not target.exists()


def test_the_start_time_is_the_process_s_own():
    me = run_lock.start_time(os.getpid())
    assert me.isdigit() and run_lock.start_time(os.getpid()) == me and run_lock.start_time(2 ** 22 + 1) == ""


def test_a_lock_directory_made_0755_by_a_unit_at_boot_is_taken_and_made_private(lock_in):
    """systemd makes a unit's RuntimeDirectory parents 0755 (the restart tier's /run/modelfleet/weights/POOL):
    only root can write such a directory, so the next run takes the lock, and the directory is 0700 again."""
    os.makedirs(f"{runlock.LOCK_DIR}/weights/pool", 0o755)
    os.chmod(runlock.LOCK_DIR, 0o755)
    run = Run()
    taken, message = runlock.acquire(run, lock_in)
    end(run)
    assert taken, message
    assert os.stat(runlock.LOCK_DIR).st_mode & 0o777 == 0o700
