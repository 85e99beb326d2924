"""A secret file as another local user meets it (operations.files.content_file, secret=True): the operation's
own commands run in order on a directory any user can enter, as the host would run them (shell commands
through sh, the upload as sftp-server writes: open O_CREAT|O_TRUNC with mode 0666 under umask 022), and after
every step an unprivileged process opens whatever it can there and keeps the descriptors; at the end it
reads them. It must get no byte of the secret, whether the file was absent, there with a wide mode, or a
symlink to a file of the attacker's."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from pyinfra.api import FileUploadCommand, StringCommand

from modelfleet.host.operations.files import content_file
from tests.helpers.made_keys import made_key

KEY = made_key()
SECRET = f"API_KEY={KEY}\n"
NOBODY = 65534
ATTACKER = r"""
import os, sys
kept = []
for line in sys.stdin:
    if line.strip() == "read":
        got = b""
        for fd in kept:
            os.lseek(fd, 0, 0)
            got += os.read(fd, 1 << 16)
        sys.stdout.write(got.decode(errors="replace") + "\n--end--\n")
        sys.stdout.flush()
        continue
    for name in os.listdir(sys.argv[1]):
        try:
            kept.append(os.open(os.path.join(sys.argv[1], name), os.O_RDONLY | os.O_NONBLOCK))
        except OSError:
            pass
    sys.stdout.write("looked\n")
    sys.stdout.flush()
"""


def sftp_write(path: str, data: bytes) -> None:
    old = os.umask(0o022)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    finally:
        os.umask(old)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


@pytest.fixture
def attacker():
    python = shutil.which("python3", path="/usr/bin:/bin")
    if os.geteuid() != 0 or not python:
        pytest.skip("needs root (to play root and another user) and a system python3")
    top = Path(tempfile.mkdtemp(prefix="modelfleet-secret-"))  # 0700 from mkdtemp: opened to others below
    os.chmod(top, 0o755)
    folder = top / "etc-modelfleet"
    folder.mkdir()
    os.chmod(folder, 0o755)  # not the 0700 the stage keeps: the file's own mode is all that guards it here
    proc = subprocess.Popen([python, "-c", ATTACKER, str(folder)], user=NOBODY, group=NOBODY,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    yield top, folder, proc
    proc.kill()
    proc.wait()
    shutil.rmtree(top)


def ask(proc, what: str) -> str:
    proc.stdin.write(what + "\n")
    proc.stdin.flush()
    if what == "read":
        lines = []
        while (line := proc.stdout.readline()) != "--end--\n":
            lines.append(line)
        return "".join(lines)
    return proc.stdout.readline()


@pytest.mark.parametrize("before", ["absent", "wide", "attacker_symlink"])
def test_no_other_user_reads_a_secret_at_any_step(attacker, before):
    top, folder, proc = attacker
    dest = folder / "pool.env"
    theirs = top / "theirs"
    if before == "wide":
        sftp_write(str(dest), b"OLD=1\n")  # an earlier, world-readable copy
    elif before == "attacker_symlink":
        theirs.write_text("")
        os.chown(theirs, NOBODY, NOBODY)
        os.symlink(theirs, folder / ".pool.env.modelfleet-tmp")  # a name the operation uses
    steps = list(content_file._inner(dest=str(dest), content=SECRET, current=None, mode="0600", secret=True))
    assert any(isinstance(s, FileUploadCommand) for s in steps)
    ask(proc, "look")
    for step in steps:
        if isinstance(step, StringCommand):
            subprocess.run(["sh", "-c", step.get_raw_value()], check=True)
        else:
            sftp_write(step.dest, step.src.getvalue())
        ask(proc, "look")
    assert dest.read_text() == SECRET and oct(dest.stat().st_mode & 0o777) == "0o600"
    got = ask(proc, "read")
    assert KEY not in got and (not theirs.exists() or KEY not in theirs.read_text())
    assert sorted(p.name for p in folder.iterdir()) == ["pool.env"]
