"""One modelfleet run per host: the lock's holder on the host (modelfleet.run.runlock sends it as `python3 -c`).

    run_lock.py DIR RECORD [STALE]

Takes an flock on DIR/run.lock, or prints who holds it (`busy <pid> <record>`); then holds it, as this very
process, until stdin closes at the run's end. DIR is created 0700 and must be this user's, writable by no one
else, not a symlink (nobody else can put a name in it); it is made 0700 again where it is not. Every name in it
is opened with O_NOFOLLOW and must be a regular file of this user, so a symlink or a FIFO planted there (by root
alone) is refused, never followed or waited on.

STALE is the holder record the control node judged dead (its run's process gone). The lock is taken over only
when the holder file still says exactly that, and the pid it names is the process that holds the flock on this
file now (/proc/locks) with the start time recorded when it took it: a pid read from a file is never killed
on its word alone, and a recycled pid has another start time.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import stat
import sys
import time

LOCK, HOLDER = "run.lock", "run.lock.holder"
FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), '' when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return ""


def flock_holders(st: os.stat_result) -> set[int]:
    """Pids that hold an flock on the file `st` describes (its device and inode as /proc/locks prints them)."""
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    holders = set()
    try:
        with open("/proc/locks") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == inode and fields[4].isdigit():
                    holders.add(int(fields[4]))
    except OSError:
        pass
    return holders


def own_dir(path: str) -> int:
    """A descriptor of DIR, created 0700 when absent; None when it is not this user's private directory. One
    only this user could write (systemd makes a unit's RuntimeDirectory parents 0755) is made 0700 again: nobody
    else can have put a name in it."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        fd = None
    st = os.fstat(fd) if fd is not None else os.lstat(path)
    if fd is None or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        print(f"refused: {path} is not a directory of uid {os.geteuid()} with mode 0700 (uid {st.st_uid}, "
              f"mode {stat.filemode(st.st_mode)}); remove it", flush=True)
        if fd is not None:
            os.close(fd)
        return None
    if st.st_mode & 0o077:
        os.fchmod(fd, 0o700)
    return fd


def open_own(dir_fd: int, name: str, flags: int):
    """`name` in DIR as a regular file of this user (created 0600), never through a symlink; None otherwise."""
    try:
        fd = os.open(name, flags | FLAGS, 0o600, dir_fd=dir_fd)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        return None
    return fd


def read_holder(dir_fd: int) -> dict:
    fd = open_own(dir_fd, HOLDER, os.O_RDONLY)
    if fd is None:
        return {}
    with os.fdopen(fd) as f:
        try:
            holder = json.loads(f.read() or "{}")
        except ValueError:
            return {}
    return holder if isinstance(holder, dict) else {}


def holder_is(holder: dict, lock_st: os.stat_result) -> bool:
    """The recorded pid holds the flock on this file now and started when the record says."""
    pid = holder.get("pid")
    return (isinstance(pid, int) and pid > 1 and pid in flock_holders(lock_st)
            and bool(holder.get("start")) and start_time(pid) == holder["start"])


def terminate(holder: dict, lock_st: os.stat_result) -> bool:
    """SIGTERM the verified holder, through a pidfd where there is one (the check and the signal then name the
    same process even if it exits in between)."""
    pid = holder["pid"]
    pidfd = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return False
    try:
        if not holder_is(holder, lock_st):
            return False
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        else:
            os.kill(pid, signal.SIGTERM)
        return True
    except OSError:
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


def take(fd: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def main(argv: list[str]) -> int:
    directory, record = argv[0], json.loads(argv[1])
    stale = json.loads(argv[2]) if len(argv) > 2 else None
    os.umask(0o077)
    dir_fd = own_dir(directory)
    if dir_fd is None:
        return 0
    fd = open_own(dir_fd, LOCK, os.O_RDWR | os.O_CREAT)
    if fd is None:
        print(f"refused: {directory}/{LOCK} is not a regular file of uid {os.geteuid()}; remove it", flush=True)
        return 0
    lock_st = os.fstat(fd)
    if not take(fd, 0):
        holder = read_holder(dir_fd)
        if not (stale and holder.get("record") == stale and terminate(holder, lock_st) and take(fd, 10)):
            print(f"busy {holder.get('pid', '')} {json.dumps(holder.get('record', {}))}", flush=True)
            return 0
    hfd = open_own(dir_fd, HOLDER, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    if hfd is None:
        print(f"refused: {directory}/{HOLDER} is not a regular file of uid {os.geteuid()}; remove it", flush=True)
        return 0
    pid = os.getpid()
    with os.fdopen(hfd, "w") as f:
        json.dump({"pid": pid, "start": start_time(pid), "record": record}, f)
    print("locked", flush=True)
    while sys.stdin.buffer.read(65536):  # held until the run's channel closes
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
