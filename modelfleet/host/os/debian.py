"""The Debian family (Debian, Ubuntu): dpkg and apt. Packages, holds, repositories and their signing keys, decided
from a DeployedState read once (no dpkg round trip per operation); the paths apt reads; dpkg's versions. The
contract it keeps is modelfleet.host.os's; its tables are catalog/os.yaml's `debian` section. apt's own notions (a
suite and components, `$(ARCH)` and dpkg's architecture names, one-line sources) stay here."""

from __future__ import annotations

import re
import shlex

from pyinfra import host
from pyinfra.api import FunctionCommand, StringCommand, operation

from modelfleet.host.operations.report import note, refuse
from modelfleet.host.os import Repository, family_data, key_fetched  # noqa: F401 (the contract names it)
from modelfleet.plan import trust

NAME = "debian"

KEYRINGS = "/etc/apt/keyrings"  # where a downloaded repository key goes (signed-by names it)
SOURCES_DIR = "/etc/apt/sources.list.d"
# unattended-upgrades' configuration of what it leaves alone
UPGRADES_CONF = "/etc/apt/apt.conf.d/51modelfleet-unattended-upgrades"
# Debian/Ubuntu flag a pending kernel (or library) update here; reported, never a reason to reboot by itself.
REBOOT_REQUIRED = "/run/reboot-required"
REBOOT_SH = None  # the question is a file DeployedState reads, not a program it runs
# How the `urls` view names a source file's repository, and the distribution's own (a host's configuration).
SOURCE_KIND = "apt repository"
OWN_SOURCES = "their own apt sources"
# NVIDIA's CUDA repository comes in through its cuda-keyring package (the list file and the key it ships).
CUDA_KEYRING = ("cuda-keyring", "cuda-keyring_1.1-1_all.deb", "/usr/share/keyrings/cuda-archive-keyring.gpg")
AMD_KEYRING = f"{KEYRINGS}/rocm.gpg"  # what amdgpu-install brings, for its two lists
# The installed package "$1" as DeployedState reads it: `ii VERSION`, or `hi VERSION` when held; nothing else.
PACKAGE_STATE_SH = "dpkg-query -W -f='${db:Status-Abbrev} ${Version}\\n' -- \"$1\" 2>/dev/null | grep -E '^[hi]i '"


def names(role: str, os_info: dict | None = None):
    """catalog/os.yaml's package names for `role` (base, kernel_headers, router_base, router_firewall, distro_docker,
    docker, docker_holds, nvidia_driver, nvidia_pinning, fabric_manager, cuda_toolkit); the same on every
    release of this family."""
    return family_data(NAME)["packages"][role]


def arch(machine: str | None) -> str:
    """dpkg's name for `uname -m` (amd64 where unknown, as apt's lists assumed before)."""
    return family_data(NAME)["arches"].get(machine or "", "amd64")


def upstream(version: str) -> str:
    """'1:580.159.04-1ubuntu1' -> '580.159.04' (no epoch, no Debian revision)."""
    return re.sub(r"-[^-]*$", "", version.split(":", 1)[-1])


def upstream_sh(package: str) -> str:
    """Prints the installed `package`'s upstream version, as upstream() reads it (fails when not installed)."""
    return (f"dpkg-query -W -f='${{Version}}' {shlex.quote(package)} | sed 's/^[0-9]*://; s/-[^-]*$//'")


def key_path(repo: str) -> str:
    """Where a repository's downloaded key goes, named after the repository (docker.asc, ...)."""
    return f"{KEYRINGS}/{repo}.asc"


def source(name: str, url: str, suite: str, components: str = "", key: str | None = None,
           arch: str | None = None) -> tuple[str, str]:
    """(list file, its one `deb` line) for a repository; `suite` ending in / is a flat repository."""
    options = " ".join([*([f"arch={arch}"] if arch else []), *([f"signed-by={key}"] if key else [])])
    words = ["deb", *([f"[{options}]"] if options else []), url, suite, *([components] if components else [])]
    return f"{SOURCES_DIR}/{name}.list", " ".join(words) + "\n"


def repository(name: str, url: str, os_info: dict | None, key_url: str | None = None) -> Repository:
    """A repository laid out as catalog/os.yaml's `repositories` entry `name` says (under `url`, the configured
    base), with its key fetched to /etc/apt/keyrings (from `key_url`, else the layout's own key path)."""
    layout, os_info = family_data(NAME)["repositories"][name], os_info or {}
    words = {"id": os_info.get("id") or "ubuntu", "codename": os_info.get("codename") or "stable"}
    base = url.rstrip("/")
    key = key_path(name)
    list_file = source(name, f"{base}/{layout['path'].format(**words)}", layout["suite"].format(**words),
                       layout.get("components", ""), key, arch(os_info.get("arch")) if layout.get("arch") else None)
    return Repository(repo=name, url=url, sources=[list_file], key=key,
                      key_url=key_url or (f"{base}/{layout['key'].format(**words)}" if layout.get("key") else None))


def source_urls(content: str, machine: str | None) -> list[tuple[str, str]]:
    """Each `deb [options] URL SUITE [COMPONENTS]` line -> (URL, "suite SUITE"); apt's $(ARCH) as dpkg names the
    host's `uname -m`."""
    dpkg_arch, out = arch(machine), []
    for line in content.splitlines():
        words = line.split()
        while words and words[0] in ("deb", "deb-src"):
            words = words[1:]
        if words and words[0].startswith("["):
            while words and not words[0].endswith("]"):
                words = words[1:]
            words = words[1:]
        url, suite = (words + ["", ""])[:2]
        out.append((url.replace("$(ARCH)", dpkg_arch), f"suite {suite.replace('$(ARCH)', dpkg_arch)}"))
    return out


def cuda_repository(url: str, cuda_dir: str, cuda_arch: str, branch: int | None = None,
                    flavor: str = "") -> Repository:
    """NVIDIA's CUDA network repository: its cuda-keyring package, and the list file it ships rewritten with the
    configured URL (identical unless a mirror is set). The branch is held by a package here (nvidia_pinning)."""
    name, deb, keyring = CUDA_KEYRING
    repo = f"{url.rstrip('/')}/{cuda_dir}/{cuda_arch}/"
    return Repository(repo="cuda", url=url, package=name, package_url=repo + deb, keyring=keyring,
                      sources=[source(f"cuda-{cuda_dir}-{cuda_arch}", repo, "/", key=keyring)])


def amd_repository(url: str, version: str, release: str, build: str) -> Repository:
    """AMD's: the amdgpu-install package of the Ubuntu release `release` (a codename: catalog/os.yaml's `amdgpu`),
    and its two lists with the configured URL, so a site mirror serves the packages too."""
    amd = url.rstrip("/")
    return Repository(
        repo="rocm", url=url, package="amdgpu-install", keyring=AMD_KEYRING,
        package_url=f"{amd}/amdgpu-install/{version}/ubuntu/{release}/amdgpu-install_{build}_all.deb",
        sources=[source("amdgpu", f"{amd}/amdgpu/{version}/ubuntu", release, "main", AMD_KEYRING, "amd64"),
                 source("rocm", f"{amd}/rocm/apt/{version}", release, "main", AMD_KEYRING, "amd64")])


def reboot_asks() -> dict[str, list[str]]:
    """What DeployedState reads to tell whether the host needs a reboot: the file Debian's packages leave."""
    return {"paths": [REBOOT_REQUIRED]}


def reboot_needed(deployed: dict) -> bool:
    return bool(deployed["paths"].get(REBOOT_REQUIRED))


def upgrades_config() -> tuple[str, str]:
    """unattended-upgrades' file that leaves the GPU stack alone."""
    return UPGRADES_CONF, upgrades_conf()


def upgrades_conf() -> str:
    """unattended-upgrades leaves the GPU stack alone (catalog/os.yaml's upgrade_exclusions)."""
    items = "".join(f'    "{pattern}";\n' for pattern in family_data(NAME)["upgrade_exclusions"])
    return ("// Managed by modelfleet: GPU driver, Fabric Manager, CUDA and the container runtime are changed\n"
            "// only by modelfleet's GPU stack (never under a running engine).\n"
            f"Unattended-Upgrade::Package-Blacklist {{\n{items}}};\n")


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
    yield FunctionCommand(_interrupted_repaired, (), {})
    yield apt_get("update")
    versioned = any(todo.values())
    specs = [shlex.quote(f"{name}={version}-*" if version else name) for name, version in todo.items()]
    yield apt_get("install", *(["--allow-downgrades", "--allow-change-held-packages"] if versioned else []), *specs)


# dpkg's journal of an unfinished run (power lost mid-install), or packages it left unpacked or half-configured.
DPKG_INTERRUPTED_SH = "ls -A /var/lib/dpkg/updates 2>/dev/null | grep -q . || dpkg --audit 2>/dev/null | grep -q ."
# dpkg first (it replays its journal; a package whose dependencies are missing stays unconfigured), then apt
# installs what they need and configures the rest; the check after says whether anything is left.
DPKG_REPAIR_SH = ("export DEBIAN_FRONTEND=noninteractive; dpkg --configure -a --force-confdef --force-confold; "
                  "apt-get -q update && apt-get -y -q -f install -o Dpkg::Options::=--force-confdef "
                  "-o Dpkg::Options::=--force-confold && ! { " + DPKG_INTERRUPTED_SH + "; }")


def _interrupted_repaired(state, host) -> bool:
    """FunctionCommand body: a package install interrupted mid-way (apt refuses every install until it is
    finished) is finished first, and named; one that cannot be is the host's one line."""
    quiet = {"print_output": False, "print_input": False}
    interrupted, _ = host.run_shell_command(StringCommand("sh", "-c", shlex.quote(DPKG_INTERRUPTED_SH)), **quiet)
    if not interrupted:
        return True
    note(state, host, "an interrupted package install (dpkg) was found: finishing it first (dpkg --configure -a, "
                      "apt-get -f install)")
    repaired, output = host.run_shell_command(StringCommand("sh", "-c", shlex.quote(DPKG_REPAIR_SH)), **quiet)
    return repaired or refuse(state, host, [
        "an interrupted package install (dpkg) could not be finished: "
        f"{(output.stderr_lines or ['no output'])[-1]}; run `dpkg --configure -a` there, then re-run"])


@operation()
def held(names: list[str], current: dict):
    """`apt-mark hold`, so an unattended upgrade cannot move these packages."""
    todo = [n for n in names if not (current.get(n) or {}).get("held")]
    if not todo:
        host.noop(f"held: {', '.join(names) or '(none)'}")
        return
    yield StringCommand("apt-mark", "hold", *todo)


@operation()
def repo_package(package: str | None, url: str | None, current: dict, keyring: str | None = None,
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


def exact_install_sh(names: list[str], reference_package: str) -> str:
    """Install `names` at the installed `reference_package`'s upstream version (read on the host once it is
    installed), allowing a downgrade and a held package to move."""
    install = apt_get("install", "--allow-downgrades", "--allow-change-held-packages",
                      *[f"{shlex.quote(n)}=\"$v-*\"" for n in names]).get_raw_value()
    return f"v=$({upstream_sh(reference_package)}) && [ -n \"$v\" ] && {install}"
