"""Write a file that holds secrets: mode 0600, never printed, never in a command line or a diff."""

from __future__ import annotations

import hashlib
import posixpath
from io import BytesIO

from pyinfra import host
from pyinfra.api import FileUploadCommand, StringCommand, operation
from pyinfra.facts.files import File, Sha256File


@operation()
def secret_file(dest: str, content: str, owner: str = "root"):
    """
    Keep `dest` equal to `content` with mode 0600. The upload goes through a temp file inside the
    destination's own directory (which must be 0700) so the secret is never readable by others.
    """
    wanted = hashlib.sha256(content.encode()).hexdigest()
    current = host.get_fact(Sha256File, path=dest)
    info = host.get_fact(File, path=dest)
    if current == wanted and info and info["mode"] == 600 and info["user"] == owner:
        host.noop(f"secret file {dest} is up to date (content not shown)")
        return
    directory, name = posixpath.split(dest)
    yield FileUploadCommand(BytesIO(content.encode()), dest,
                            remote_temp_filename=posixpath.join(directory, f".{name}.modelfleet-tmp"))
    yield StringCommand("chown", f"{owner}:", dest, "&&", "chmod", "0600", dest)
