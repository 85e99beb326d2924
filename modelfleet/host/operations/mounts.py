"""Directories an engine container writes, mounted nosuid,nodev on the host: a setuid binary or a device node
an engine (or a model's own code, `trust_remote_code`) plants in its cache gives nobody root or a disk, on the
host or in the next engine that mounts the cache. Docker's `-v` takes no such option; its bind of a directory
below such a mount carries the flags into the container."""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import StringCommand, operation

MOUNTINFO = "/proc/self/mountinfo"
FLAGS = ("nosuid", "nodev")


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mount_options(mountinfo: str | None, path: str) -> set[str] | None:
    """The per-mount options of the mount at exactly `path` (the last one stacked there), None when `path` is no
    mount point."""
    found = None
    for line in (mountinfo or "").splitlines():
        fields = line.split()
        if len(fields) > 5 and _unescape(fields[4]) == path.rstrip("/"):
            found = set(fields[5].split(","))
    return found


def fstab_line(path: str) -> str:
    escaped = path.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011")
    return f"{escaped} {escaped} none bind,{','.join(FLAGS)},nofail 0 0"


@operation()
def private_bind(path: str, mountinfo: str | None):
    """`path` bind-mounted onto itself nosuid,nodev (or an existing mount there remounted so), and kept across
    reboots by an fstab line. `mountinfo`: the host's /proc/self/mountinfo, read with the stage's state."""
    options = mount_options(mountinfo, path)
    if options is not None and set(FLAGS) <= options:
        host.noop(f"{path} is mounted {','.join(FLAGS)}")
        return
    q, line = shlex.quote(path), shlex.quote(fstab_line(path))
    remount = f"mount -o remount,bind,{','.join(FLAGS)} {q}"
    yield StringCommand("sh", "-c", shlex.quote(
        f"{{ grep -qxF {line} /etc/fstab || printf '%s\\n' {line} >> /etc/fstab; }} && "
        f"{{ mountpoint -q {q} || mount --bind {q} {q}; }} && {remount}"))
