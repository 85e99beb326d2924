"""Debian packages, apt sources and keys, decided from a DeployedState read once: no dpkg round trip per operation."""

from __future__ import annotations

import posixpath
import shlex

from pyinfra import host
from pyinfra.api import FunctionCommand, StringCommand, operation

from modelfleet import trust
from modelfleet.host_commands import deb_upstream as upstream
from modelfleet.operations.report import refuse


def apt_get(*args: str) -> StringCommand:
    """Every apt-get call: never prompts, keeps config files an admin changed."""
    return StringCommand("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-y", "-q",
                         "-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold", *args)


def missing(wanted: dict[str, str | None], current: dict) -> dict[str, str | None]:
    """Packages to install: absent, or (when an upstream version is asked for) at another version."""
    return {name: version for name, version in wanted.items()
            if not current.get(name) or (version and upstream(current[name]["version"]) != version)}


@operation()
def packages(wanted: dict[str, str | None], current: dict):
    """
    `wanted`: name -> upstream version (None: any). One `apt-get update` and one install for what is missing.
    A version asked for may be a downgrade or move a held package: that is the point of asking for it.
    """
    todo = missing(wanted, current)
    if not todo:
        host.noop(f"packages {', '.join(wanted) or '(none)'} are installed")
        return
    yield apt_get("update")
    versioned = any(todo.values())
    specs = [shlex.quote(f"{name}={version}-*" if version else name) for name, version in todo.items()]
    yield apt_get("install", *(["--allow-downgrades", "--allow-change-held-packages"] if versioned else []), *specs)


@operation()
def held(names: list[str], current: dict):
    """`apt-mark hold`, so an unattended upgrade cannot move these packages."""
    todo = [n for n in names if not (current.get(n) or {}).get("held")]
    if not todo:
        host.noop(f"held: {', '.join(names) or '(none)'}")
        return
    yield StringCommand("apt-mark", "hold", *todo)


@operation()
def deb_from_url(package: str | None, url: str | None, current: dict, keyring: str | None = None,
                 repo: str = "", fingerprints: tuple[str, ...] = ()):
    """Install a .deb published at a URL (cuda-keyring, amdgpu-install) unless that package is installed. The
    repository keyring it brings (`keyring`, a path inside the package) is checked against the pinned
    fingerprints first: a package with another key is never installed."""
    if not package or current.get(package):
        host.noop(f"{package or 'no repository package'} installed")
        return
    # In a directory mktemp makes for root (0700, a name nobody could guess): a fixed path in /tmp is one any
    # local user can plant a symlink at before root writes through it. A keyring package's key is checked in its
    # unpacked copy before apt may install (and so trust) it.
    deb = f'"$d"/{shlex.quote(package + ".deb")}'
    check = (["(", "cd", '"$d"', "&&", "dpkg-deb", "-x", shlex.quote(package + ".deb"), "x", "&&",
              trust.check_command("x" + keyring, repo, fingerprints), ")", "&&"] if keyring else [])
    yield StringCommand("d=$(mktemp -d)", "&&", "{", "curl", "-fsSL", "--retry", "3", "-o", deb, shlex.quote(url),
                        "&&", *check, apt_get("install", deb), ";", "}", ";", "rc=$?;", "rm", "-rf", '"$d";', "exit",
                        "$rc")


@operation()
def key_fetched(url: str | None, dest: str | None, current: dict | None, repo: str = "",
                fingerprints: tuple[str, ...] = ()):
    """A repository's signing key (ASCII-armoured, as published) at `dest`, fetched once from `url` and put in
    place only when its fingerprint is the one pinned for `repo` (else the host fails, naming both)."""
    if not dest or current:
        host.noop(f"key {dest or '(none)'} is in place")
        return
    yield StringCommand("install", "-d", "-m", "0755", posixpath.dirname(dest))
    yield StringCommand(f"curl -fsSL --retry 3 -o {dest}.tmp {shlex.quote(url)} && "
                        f"{trust.check_command(dest + '.tmp', repo, fingerprints)} && chmod 0644 {dest}.tmp && "
                        f"mv {dest}.tmp {dest} || {{ rm -f {dest}.tmp; exit 1; }}")


def _in_archive(state, host, package: str, refusal: str) -> bool:
    """FunctionCommand body: the archive (read fresh) has `package`, else the host is refused with `refusal`."""
    quiet = {"print_output": False, "print_input": False}
    updated, output = host.run_shell_command(apt_get("update"), **quiet)
    if not updated:
        return refuse(state, host, [f"apt-get update failed: {(output.stderr_lines or ['no output'])[-1]}"])
    found, _ = host.run_shell_command(StringCommand("apt-cache", "show", "--no-all-versions", shlex.quote(package)),
                                      **quiet)
    return found or refuse(state, host, [refusal])


@operation()
def in_archive(package: str | None, refusal: str, current: dict):
    """Before anything is installed: the host's archive offers `package` (installed already: nothing to ask)."""
    if not package or current.get(package):
        host.noop(f"{package or 'no package'} needs no look-up")
        return
    yield FunctionCommand(_in_archive, (package, refusal), {})
