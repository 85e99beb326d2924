"""Files and directories decided from a DeployedState read once per stage: no stat or sha round trip each."""

from __future__ import annotations

import hashlib
import posixpath
import shlex
from io import BytesIO

from pyinfra import host
from pyinfra.api import FileUploadCommand, StringCommand, operation


def _owned(current: dict | None, kind: str, mode: str, user: str, group: str) -> bool:
    return bool(current) and current["kind"] == kind and (current["mode"], current["user"], current["group"]) == (
        mode.lstrip("0").zfill(3), user, group)


def content_changes(current: dict | None, content: str, mode: str, user: str = "root", group: str = "root") -> bool:
    """Would `content_file` change anything? Known before the run, so --dry tells the truth."""
    wanted = hashlib.sha256(content.encode()).hexdigest()
    return not (_owned(current, "file", mode, user, group) and current["sha256"] == wanted)


@operation()
def directory(path: str, current: dict | None, mode: str = "0755", user: str = "root", group: str = "root"):
    """A directory with this mode and owner (parents created as needed)."""
    if _owned(current, "dir", mode, user, group):
        host.noop(f"directory {path} is in place")
        return
    p = shlex.quote(path)
    yield StringCommand("mkdir", "-p", p, "&&", "chown", f"{user}:{group}", p, "&&", "chmod", mode, p)


@operation()
def content_file(dest: str, content: str, current: dict | None, mode: str = "0644", user: str = "root",
                 group: str = "root", secret: bool = False):
    """
    Keep `dest` equal to `content`. Never prints a diff. A secret is uploaded to a temp file inside the
    destination's own directory (which the stage keeps 0700) and only then given its mode and name.
    """
    if not content_changes(current, content, mode, user, group):
        host.noop(f"file {dest} is up to date" + (" (content not shown)" if secret else ""))
        return
    directory_, name = posixpath.split(dest)
    temp = posixpath.join(directory_, f".{name}.modelfleet-tmp") if secret else None
    yield FileUploadCommand(BytesIO(content.encode()), dest, remote_temp_filename=temp)
    yield StringCommand("chown", f"{user}:{group}", shlex.quote(dest), "&&", "chmod", mode, shlex.quote(dest))
