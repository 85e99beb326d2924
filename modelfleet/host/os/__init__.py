"""The OS seam: what the stages ask of a host's operating system family, and the tables of the releases it covers.

A stage never speaks a package manager itself: it asks `family(os_info)` (os_info as preflight's probe reads
/etc/os-release) and uses what that module defines. The tables (releases, their codenames and vendor repository
names, each family's package names and repository layouts) live in catalog/os.yaml; the family's code in
modelfleet/host/os/<family>.py, loaded by the name the data gives it, so a new family is its own module and a data
section (docs/adding-an-os-family.md counts the files).

The contract speaks what every package manager has; a family module defines:
- repositories, as `Repository` records the family decides from catalog data: `repository(name, url, os_info,
  key_url)` (Docker's, the container toolkit's: the family's `repositories` table says how its package manager
  lays them out), `cuda_repository(url, cuda_dir, cuda_arch, branch, flavor)`, `amd_repository(url, version,
  release, build)`; `source_urls(content, machine)` -> [(url, what)] for the `urls` view;
- keys: `key_fetched(url, dest, current, repo, fingerprints)` (a repository's key, put in place only when its
  fingerprint is pinned; defined below, the same for every family) and `repo_package(...)` (a vendor's package
  that brings its repository and key, the key checked first); a function body (PACKAGE_STATE_SH, REBOOT_SH) ends
  with `return`, never `exit`;
- packages, each operation deciding from DeployedState's view: `packages(wanted, current)` (name -> upstream
  version or None), `held(names, current)`, `in_archive(package, refusal, current)`; `missing(wanted, current)`,
  the pure decision; versions: `upstream(version)`, `upstream_sh(package)`, `exact_install_sh(names, reference)`;
- the host's package database for DeployedState: `PACKAGE_STATE_SH`, a shell body that prints `ii VERSION` for
  the installed package "$1", `hi VERSION` when it is held, nothing else (the seam's two words, dpkg's letters);
- whether the host needs a reboot, a question the family answers its own way: `reboot_asks()` (what DeployedState
  reads for it), `reboot_needed(deployed)`, and `REBOOT_SH` (a shell body, exit 0 when a reboot is needed, that
  DeployedState runs for a family that asks that way; None for one that reads a file);
- `upgrades_config()` -> (path, content) that keeps the family's automatic updater off the GPU stack, or None;
- `names(role, os_info)` (catalog/os.yaml's package names; a release may override its family's), `NAME`, and the
  `urls` view's words `SOURCE_KIND`, `OWN_SOURCES`.
The service manager is systemd for every family (modelfleet.host.operations.service, modelfleet.host.units).
"""

from __future__ import annotations

import functools
import importlib
import posixpath
import shlex
from dataclasses import dataclass, field
from types import ModuleType

import yaml
from pyinfra import host
from pyinfra.api import StringCommand, operation

from modelfleet import PACKAGE_DIR
from modelfleet.plan import trust

DATA_FILE = PACKAGE_DIR / "plan" / "catalog" / "os.yaml"


@functools.cache
def table() -> dict:
    return yaml.safe_load(DATA_FILE.read_text())


@dataclass
class Repository:
    """A package repository as a family brings it in, decided from catalog data: the source files it writes
    (with the configured URL, so a site mirror serves the packages too) and where its key comes from. Either the
    key is fetched from `key_url` to `key` (checked against the pins of `repo` first), or a package published at
    `package_url` brings the repository and its key (`keyring`, a path inside the package, checked first)."""

    repo: str  # its name in catalog/signing_keys.yaml
    url: str = ""  # the base URL, as configured
    sources: list[tuple[str, str]] = field(default_factory=list)  # (file, content)
    key: str | None = None  # where its key lies on the host
    key_url: str | None = None  # where that key is fetched from (None: it comes with `package`)
    package: str | None = None
    package_url: str | None = None
    keyring: str | None = None


def family_name(os_info: dict | None) -> str:
    """The family of an OS by its /etc/os-release ID; the default family for one no family lists (or unknown)."""
    os_id = (os_info or {}).get("id")
    for name, fam in table()["families"].items():
        if os_id in fam["ids"]:
            return name
    return table()["default_family"]


def family(os_info: dict | None = None) -> ModuleType:
    """The family module for this OS (modelfleet/host/os/<family>.py)."""
    return by_name(family_name(os_info))


def by_name(name: str | None) -> ModuleType:
    """The family module of that name (the default family for None)."""
    name = name or table()["default_family"]
    if name not in table()["families"]:
        raise KeyError(f"catalog/os.yaml: no family {name!r}")
    return importlib.import_module(f"{__name__}.{name}")


def family_data(name: str) -> dict:
    return table()["families"][name]


def release(os_info: dict | None) -> dict | None:
    """The release entry for (ID, VERSION_ID), or None when the stack does not cover it."""
    key = ((os_info or {}).get("id"), (os_info or {}).get("version_id"))
    return next((r for r in table()["releases"] if (r["id"], r["version_id"]) == key), None)


def releases(having: str) -> list[tuple[str, str]]:
    """(ID, VERSION_ID) of every release with a `having` entry (cuda: NVIDIA's repository, amdgpu: AMD's)."""
    return [(r["id"], r["version_id"]) for r in table()["releases"] if r.get(having)]


def supported(having: str) -> str:
    """The releases with `having`, as a refusal names them: "Ubuntu 22.04, 24.04, Debian 12, RHEL 9.4, ..."
    (a family's `labels` name an ID; else it is capitalized)."""
    labels = {i: label for fam in table()["families"].values() for i, label in (fam.get("labels") or {}).items()}
    by_id: dict[str, list[str]] = {}
    for os_id, version in releases(having):
        by_id.setdefault(os_id, []).append(version)
    return ", ".join(f"{labels.get(os_id, os_id.capitalize())} {', '.join(versions)}"
                     for os_id, versions in by_id.items())


def codename(os_id: str, version_id: str) -> str | None:
    return (release({"id": os_id, "version_id": version_id}) or {}).get("codename")


def cuda_arches() -> dict[str, str]:
    """`uname -m` -> the architecture directory of NVIDIA's CUDA repository."""
    return table()["cuda_arches"]


@operation()
def key_fetched(url: str | None, dest: str | None, current: dict | None, repo: str = "",
                fingerprints: tuple[str, ...] = ()):
    """A repository's signing key (ASCII-armoured, as published) at `dest`, fetched once from `url` and put in
    place only when its fingerprint is the one pinned for `repo` (else the host fails, naming both). Every family
    fetches keys this way (curl and the pinned check know no package manager)."""
    if not dest or current:
        host.noop(f"key {dest or '(none)'} is in place")
        return
    yield StringCommand("install", "-d", "-m", "0755", posixpath.dirname(dest))
    yield StringCommand(f"curl -fsSL --retry 3 -o {dest}.tmp {shlex.quote(url)} && "
                        f"{trust.check_command(dest + '.tmp', repo, fingerprints)} && chmod 0644 {dest}.tmp && "
                        f"mv {dest}.tmp {dest} || {{ rm -f {dest}.tmp; exit 1; }}")
