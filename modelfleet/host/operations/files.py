"""Files and directories decided from a DeployedState read once per stage: no stat or sha round trip each."""

from __future__ import annotations

import fnmatch
import hashlib
import posixpath
import shlex
from io import BytesIO

from pyinfra import host
from pyinfra.api import FileUploadCommand, FunctionCommand, StringCommand, operation

from modelfleet import FILES_DIR
from modelfleet.host.operations.report import refuse

# Left in every directory `directory` creates (or takes over while empty): the proof it is modelfleet's.
MARKER = ".modelfleet-owned"
# Names modelfleet writes into the directories it owns: its own dot files (the marker, a checkpoint's manifest
# and fetch lock, a secret's upload temp file), the config directory's files (ServicePlan.env_file,
# secrets_config_file and auth_file; a rank's restart count, Ollama's Modelfile; the model stage's hub token, fetch
# jobs and their logs, the peer servers' jobs) and the tools it copies.
OWN_NAMES = (".modelfleet-*", ".*.modelfleet-tmp", "[A-Za-z0-9]*.env", "[A-Za-z0-9]*.secrets.yaml",
             "[A-Za-z0-9]*.auth", "[A-Za-z0-9]*.rank-restarts", "[A-Za-z0-9]*.Modelfile", "hf-token",
             "checkpoint-*.json", "checkpoint-*.json.log", "engine-cache-*.json", "engine-cache-*.json.log",
             "fanout-*.json",
             # A front door's (modelfleet.plan.router.paths): the router's config, replicas and keys, the proxy's.
             "router-*.json", "router-*.workers", "router-*.key", "router-*.admin", "router-*.admin-auth",
             "router-*.nft",
             "door-*.conf", "door-*.crt", "door-*.tls-key",
             *sorted(p.name for p in FILES_DIR.glob("*.py")))


def _owned(current: dict | None, kind: str, mode: str, user: str, group: str) -> bool:
    return bool(current) and current["kind"] == kind and (current["mode"], current["user"], current["group"]) == (
        mode.lstrip("0").zfill(3), user, group)


def content_changes(current: dict | None, content: str, mode: str, user: str = "root", group: str = "root") -> bool:
    """Would `content_file` change anything? Known before the run, so --dry tells the truth."""
    wanted = hashlib.sha256(content.encode()).hexdigest()
    return not (_owned(current, "file", mode, user, group) and current["sha256"] == wanted)


def foreign_entries(current: dict | None, claimed: bool = False) -> list[str]:
    """What makes an existing directory someone else's ([] when modelfleet may take it over). It is
    modelfleet's when it is absent, empty, holds the marker or another `.modelfleet-*` file (a checkpoint
    directory: its manifest or fetch lock), holds only names modelfleet writes (a directory made before the
    marker existed), or `claimed` (the caller has its own proof: storage's filesystem carries its label).
    A state that did not list the entries (an older recording) is taken as it is, as before."""
    if claimed or not current or current.get("kind") != "dir":
        return []
    entries = current.get("entries") or []
    if any(fnmatch.fnmatchcase(e, ".modelfleet-*") for e in entries):
        return []
    return [e for e in entries if not any(fnmatch.fnmatchcase(e, pattern) for pattern in OWN_NAMES)]


@operation()
def directory(path: str, current: dict | None, mode: str = "0755", user: str = "root", group: str = "root",
              claimed: bool = False):
    """
    A directory with this mode and owner (parents created as needed), marked as modelfleet's when created.
    A directory that exists and is someone else's (foreign_entries) is refused, naming it: modelfleet never
    chowns, chmods or writes into a non-empty directory it did not make.
    """
    p = shlex.quote(path)
    foreign = foreign_entries(current, claimed)
    if current and current.get("kind") != "dir":
        yield FunctionCommand(refuse, ([f"{path} exists and is not a directory: refusing to replace it"],), {})
        return
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        yield FunctionCommand(refuse, ([
            f"{path} is not empty ({shown}) and modelfleet did not make it: refusing to chown, chmod or write "
            f"into it. Name another directory in the inventory, or, if it is modelfleet's, "
            f"`touch {path}/{MARKER}`"],), {})
        return
    # The marker made O_EXCL (noclobber), never through a link: an engine cache's directory is its container's too.
    m = shlex.quote(f"{path}/{MARKER}")
    marked = ["{", "[", "-L", m, "]", "||", "[", "-e", m, "]", "||", "(", "set", "-C;", ":", ">", m, ");", "}"]
    if _owned(current, "dir", mode, user, group):
        # A directory taken over as it was (made by someone else, or by modelfleet before the marker, with this
        # owner and mode) is marked too: what modelfleet writes there later need not be a name it knows.
        if "entries" in current and not any(fnmatch.fnmatchcase(e, ".modelfleet-*") for e in current["entries"]):
            yield StringCommand(*marked)
            return
        host.noop(f"directory {path} is in place")
        return
    yield StringCommand("mkdir", "-p", p, "&&", "chown", f"{user}:{group}", p, "&&", "chmod", mode, p, "&&",
                        *marked)


@operation()
def content_file(dest: str, content: str, current: dict | None, mode: str = "0644", user: str = "root",
                 group: str = "root", secret: bool = False):
    """
    Keep `dest` equal to `content`. Never prints a diff. A secret is never in a file with another mode or owner,
    not for a moment: an empty temp file is created (O_EXCL, umask 077) beside `dest` with its final owner and
    mode, the content uploaded into it (an upload keeps an existing file's mode), then renamed over `dest`.
    """
    if not content_changes(current, content, mode, user, group):
        host.noop(f"file {dest} is up to date" + (" (content not shown)" if secret else ""))
        return
    q = shlex.quote(dest)
    if not secret:
        yield FileUploadCommand(BytesIO(content.encode()), dest)
        yield StringCommand("chown", f"{user}:{group}", q, "&&", "chmod", mode, q)
        return
    directory_, name = posixpath.split(dest)
    temp = shlex.quote(posixpath.join(directory_, f".{name}.modelfleet-tmp"))
    yield StringCommand("rm", "-f", temp, "&&", "(", "umask", "077", "&&", "set", "-C", "&&", ":", ">", temp, ")",
                        "&&", "chown", f"{user}:{group}", temp, "&&", "chmod", mode, temp)
    yield FileUploadCommand(BytesIO(content.encode()), posixpath.join(directory_, f".{name}.modelfleet-tmp"))
    yield StringCommand("mv", "-f", temp, q)
