"""The RHEL family (Red Hat Enterprise Linux, Rocky Linux, AlmaLinux 9 and 10): dnf and rpm. Repositories as
`.repo` files under /etc/yum.repos.d with their keys fetched and checked against the pins first, packages by
`dnf -y install`, holds by `dnf versionlock`, the package database read with `rpm -q --qf`, the reboot question
answered by `needs-restarting -r`'s exit status. The contract it keeps is modelfleet.host.os's; its tables are
catalog/os.yaml's `rhel` section and its releases.

How this was checked, and what was not (no RHEL host and no RPM registry can be reached from where this was
written, so nothing here has run on a RHEL host): each command's output is read as outputs recorded from public
sources show it (tests/fixtures/os-rhel/, each file's source in SOURCE there; tests/unit/test_os_rhel.py runs the
shell here against them). Not sourced, so not claimed:
- RHEL 9 chooses the driver branch by a dnf module stream (NVIDIA's guide: `dnf module enable
  nvidia-driver:580-open`); this family writes that choice as dnf's module state file
  (/etc/dnf/modules.d/nvidia-driver.module), whose five-line form was seen in a public repository's notes
  that the search tools here give no address for. A real RHEL 9 host is the check still owed.
- The proprietary kernel modules (`driver_flavor: proprietary`: NVIDIA's `cuda-drivers` with a `-dkms` stream)
  are not covered: the driver package is `nvidia-open`.
- dnf-automatic is left as the host has it: held packages are version-locked, which dnf's commands obey; that
  dnf-automatic loads the versionlock plugin was not checked here (`upgrades_config()` is None).
- RHEL 10 (dnf 5): versionlock is built in and keeps its locks in /etc/dnf/versionlock.toml (dnf 5's manual);
  `needs-restarting` is asked as `dnf needs-restarting` there, whose exit status dnf 5's manual gives; the
  package that carries that command on RHEL 10 was not found, so the base packages do not name it. On a RHEL 9
  host read before dnf-utils is installed (a first run), that fallback is dnf 4's plain `needs-restarting`,
  which lists processes: no reboot is reported then (the report's kernel_update_pending only; nothing acts on it).
- EPEL and CodeReady Builder, which DKMS and its build tools may come from (Rocky's NVIDIA guide enables both:
  https://github.com/rocky-linux/documentation/pull/3020), are the host's to enable: a missing dependency fails
  the install, naming it (dnf's own message).
- AMD's driver repository path for ROCm 7 (amdgpu/<version>/el/<release>/main/x86_64/) follows amdgpu-install's
  own amdgpu.repo for 6.4.4; AMD's 7.0.1 Rocky page lists only the ROCm and graphics repositories.
"""

from __future__ import annotations

import re
import shlex

from pyinfra import host
from pyinfra.api import FunctionCommand, StringCommand, operation

from modelfleet.host.operations.report import refuse
from modelfleet.host.os import Repository, family_data, key_fetched, release  # noqa: F401 (the contract names it)
from modelfleet.plan import trust

NAME = "rhel"

REPOS_DIR = "/etc/yum.repos.d"
KEYS_DIR = "/etc/pki/rpm-gpg"  # where a downloaded repository key goes (gpgkey=file:// names it)
MODULES_DIR = "/etc/dnf/modules.d"
SOURCE_KIND = "dnf repository"
OWN_SOURCES = "their own dnf repositories"
# `rpm -q` prints "package NAME is not installed" on stdout (rpm PR #1794) and one line per installed version;
# %{EPOCH} is "(none)" without one. The version lines have no space and a release after a dash.
_RPM_VERSION = ("rpm -q --qf '%{EPOCH}:%{VERSION}-%{RELEASE}\\n' -- \"$1\" 2>/dev/null "
                "| sed -n 's/^(none)://; /^[^ ]*-[^ ]*$/p' | tail -n 1")
_LOCKS = family_data(NAME)["versionlock"]
# A lock for "$1": dnf 4's list holds "NAME-EPOCH:VERSION-RELEASE.*" lines (`dnf versionlock list` prints them),
# dnf 5's TOML a `name = "NAME"` line per locked package.
_HELD = (f"awk -v n=\"$1\" 'index($0, n \"-\") == 1 && substr($0, length(n) + 2) ~ /^[0-9]+:/ {{f = 1}} "
         f"END {{exit !f}}' {_LOCKS['list']} 2>/dev/null || grep -qsxF \"name = \\\"$1\\\"\" {_LOCKS['toml']}")
# The installed package "$1" as DeployedState reads it: `ii VERSION`, or `hi VERSION` when version-locked. A
# function's body: `return`, never `exit` (that would end DeployedState's whole program).
PACKAGE_STATE_SH = (f"v=$({_RPM_VERSION}); [ -n \"$v\" ] || return 1; "
                    f"if {_HELD}; then echo \"hi $v\"; else echo \"ii $v\"; fi")
# Whether the host needs a reboot: needs-restarting -r exits 1 when it does, 0 when not (dnf-plugins-core's
# manual; dnf 5's `dnf needs-restarting` likewise); a missing tool (127) is no answer, so no.
REBOOT_SH = ("if command -v needs-restarting >/dev/null 2>&1; then needs-restarting -r; "
             "else dnf -q needs-restarting; fi >/dev/null 2>&1; [ $? -eq 1 ]")


def names(role: str, os_info: dict | None = None):
    """catalog/os.yaml's package names for `role`, as the host's release overrides them (RHEL 10's dnf 5 needs
    no versionlock plugin)."""
    overrides = (release(os_info) or {}).get("packages") or {}
    return overrides[role] if role in overrides else family_data(NAME)["packages"][role]


def upstream(version: str) -> str:
    """'3:580.126.09-1.el9' -> '580.126.09' (no epoch, no release)."""
    return re.sub(r"-[^-]*$", "", version.split(":", 1)[-1])


def upstream_sh(package: str) -> str:
    """Prints the installed `package`'s upstream version, as upstream() reads it (nothing when not installed)."""
    return (f"rpm -q --qf '%{{VERSION}}\\n' -- {shlex.quote(package)} 2>/dev/null | sed -n '/^[^ ]*$/p' "
            "| tail -n 1")


def key_path(repo: str) -> str:
    return f"{KEYS_DIR}/{repo}.asc"


def repo_file(section: str, name: str, baseurl: str, key: str, gpgcheck: int = 1, repo_gpgcheck: int = 0,
              priority: int | None = None) -> str:
    """One `.repo` section: the repository, enabled, checked with the key at `key` (fetched and pinned first)."""
    lines = [f"[{section}]", f"name={name}", f"baseurl={baseurl}", "enabled=1",
             *([f"priority={priority}"] if priority is not None else []), f"gpgcheck={gpgcheck}",
             *([f"repo_gpgcheck={repo_gpgcheck}"] if repo_gpgcheck else []), f"gpgkey=file://{key}"]
    return "\n".join(lines) + "\n"


def _toolkit_base(url: str) -> str:
    """The container toolkit's setting names its apt repository by default (.../stable/deb); its rpm one is the
    sibling .../stable/rpm. A mirror URL that does not end in /deb is taken as the rpm repository itself."""
    url = url.rstrip("/")
    return f"{url[:-len('/deb')]}/rpm" if url.endswith("/deb") else url


def repository(name: str, url: str, os_info: dict | None, key_url: str | None = None) -> Repository:
    """A repository laid out as catalog/os.yaml's `rhel.repositories` entry `name` says, as a .repo file, its
    key fetched to /etc/pki/rpm-gpg (from `key_url`, else the layout's own key path) and checked first."""
    layout = family_data(NAME)["repositories"][name]
    base = _toolkit_base(url) if name == "nvidia-container-toolkit" else url.rstrip("/")
    key = key_path(name)
    content = repo_file(layout["section"], layout["name"], f"{base}/{layout['path']}", key,
                        layout.get("gpgcheck", 1), layout.get("repo_gpgcheck", 0))
    return Repository(repo=layout.get("pins", name), url=url, key=key,
                      key_url=key_url or (f"{base}/{layout['key']}" if layout.get("key") else None),
                      sources=[(f"{REPOS_DIR}/{layout['file']}.repo", content)])


def source_urls(content: str, machine: str | None) -> list[tuple[str, str]]:
    """Each section's baseurl -> (URL, "repository SECTION"); dnf's $basearch as the host's `uname -m`.
    ($releasever stays: it is the host's major release, which the `urls` view does not know.)"""
    out, section = [], ""
    for line in content.splitlines():
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif line.startswith("baseurl="):
            out.append((line[len("baseurl="):].replace("$basearch", machine or "x86_64"), f"repository {section}"))
    return out


def cuda_repository(url: str, cuda_dir: str, cuda_arch: str, branch: int | None = None,
                    flavor: str = "") -> Repository:
    """NVIDIA's CUDA network repository as its own cuda-<dir>.repo names it, with the configured URL, its
    D42D0685.pub key fetched and checked; on RHEL 9, the module stream that picks the driver branch."""
    data = family_data(NAME)["cuda"]
    base = f"{url.rstrip('/')}/{cuda_dir}/{cuda_arch}"
    section, key = f"cuda-{cuda_dir}-{cuda_arch}", key_path("cuda")
    sources = [(f"{REPOS_DIR}/cuda-{cuda_dir}.repo", repo_file(section, section, base, key))]
    stream = data["streams"].get(cuda_dir)
    if stream and branch:
        module, _, chosen = stream.format(branch=branch, kind="open" if flavor else "dkms").partition(":")
        sources.append((f"{MODULES_DIR}/{module}.module",
                        f"[{module}]\nname={module}\nstream={chosen}\nprofiles=\nstate=enabled\n"))
    return Repository(repo=data["pins"], url=url, sources=sources, key=key, key_url=f"{base}/{data['key_file']}")


def amd_repository(url: str, version: str, release: str, build: str) -> Repository:
    """AMD's amdgpu (the kernel driver) and ROCm repositories for the EL release `release` (e.g. 9.6), as .repo
    files with the configured URL, AMD's key fetched and checked (the same key as its apt repositories')."""
    data, amd = family_data(NAME)["amd"], url.rstrip("/")
    words = {"version": version, "release": release, "major": release.split(".")[0]}
    key = key_path("rocm")
    return Repository(repo="rocm", url=url, key=key, key_url=f"{amd}/{data['key']}", sources=[
        (f"{REPOS_DIR}/amdgpu.repo", repo_file("amdgpu", "amdgpu", f"{amd}/{data['amdgpu'].format(**words)}", key,
                                               priority=50)),
        (f"{REPOS_DIR}/rocm.repo", repo_file("rocm", f"ROCm {version}", f"{amd}/{data['rocm'].format(**words)}",
                                             key, priority=50))])


def reboot_asks() -> dict[str, list[str]]:
    """What DeployedState reads to tell whether the host needs a reboot: this family's answer (REBOOT_SH)."""
    return {"reboots": ["host"]}


def reboot_needed(deployed: dict) -> bool:
    return bool((deployed.get("reboots") or {}).get("host"))


def upgrades_config() -> None:
    """Nothing written: see the module docstring (held packages are version-locked)."""
    return None


def dnf(*args: str) -> StringCommand:
    """Every dnf call: never prompts."""
    return StringCommand("dnf", "-y", "-q", *args)


def missing(wanted: dict[str, str | None], current: dict) -> dict[str, str | None]:
    """Packages to install: absent, or (when an upstream version is asked for) at another version."""
    return {name: version for name, version in wanted.items()
            if not current.get(name) or (version and upstream(current[name]["version"]) != version)}


@operation()
def packages(wanted: dict[str, str | None], current: dict):
    """
    `wanted`: name -> upstream version (None: any). One install for what is missing. A version asked for may be
    a downgrade or move a locked package: its lock is lifted for the install and put back after.
    """
    todo = missing(wanted, current)
    if not todo:
        host.noop(f"packages {', '.join(wanted) or '(none)'} are installed")
        return
    locked = [n for n, v in todo.items() if v and (current.get(n) or {}).get("held")]
    if locked:
        yield dnf("versionlock", "delete", *locked)
    specs = [shlex.quote(f"{name}-{version}*" if version else name) for name, version in todo.items()]
    # A version given installs that version whichever one is installed, the former removed (dnf's install
    # manual: https://man.archlinux.org/man/dnf5-install.8.en): a downgrade needs no other command.
    yield dnf("install", *(["--allowerasing"] if any(todo.values()) else []), *specs)
    if locked:
        yield dnf("versionlock", "add", *locked)


@operation()
def held(names: list[str], current: dict):
    """`dnf versionlock add`, so no update (by hand or automatic) moves these packages."""
    todo = [n for n in names if not (current.get(n) or {}).get("held")]
    if not todo:
        host.noop(f"held: {', '.join(names) or '(none)'}")
        return
    yield dnf("versionlock", "add", *todo)


@operation()
def repo_package(package: str | None, url: str | None, current: dict, keyring: str | None = None,
                 repo: str = "", fingerprints: tuple[str, ...] = ()):
    """Install an .rpm published at a URL unless that package is installed, the key it brings (`keyring`, a
    path inside it) checked against the pins first. This family's vendors need none (their .repo files and
    keys are written directly); kept so the contract holds for one that does."""
    if not package or current.get(package):
        host.noop(f"{package or 'no repository package'} installed")
        return
    rpm = f'"$d"/{shlex.quote(package + ".rpm")}'
    check = (["(", "cd", '"$d"', "&&", "mkdir", "x", "&&", "cd", "x", "&&", "rpm2cpio",
              f"../{shlex.quote(package)}.rpm", "|", "cpio", "-idm", "--quiet", "&&", "cd", "..", "&&",
              trust.check_command("x" + keyring, repo, fingerprints), ")", "&&"] if keyring else [])
    yield StringCommand("d=$(mktemp -d)", "&&", "{", "curl", "-fsSL", "--retry", "3", "-o", rpm, shlex.quote(url),
                        "&&", *check, dnf("install", rpm), ";", "}", ";", "rc=$?;", "rm", "-rf", '"$d";', "exit",
                        "$rc")


def _in_archive(state, host, package: str, refusal: str) -> bool:
    """FunctionCommand body: the enabled repositories (read fresh) offer `package`, else the host is refused."""
    quiet = {"print_output": False, "print_input": False}
    found, _ = host.run_shell_command(StringCommand("sh", "-c", shlex.quote(
        f"dnf -q makecache >/dev/null && [ -n \"$(dnf -q repoquery -- {shlex.quote(package)})\" ]")), **quiet)
    return found or refuse(state, host, [refusal])


@operation()
def in_archive(package: str | None, refusal: str, current: dict):
    """Before anything is installed: the host's repositories offer `package` (installed already: nothing to ask)."""
    if not package or current.get(package):
        host.noop(f"{package or 'no package'} needs no look-up")
        return
    yield FunctionCommand(_in_archive, (package, refusal), {})


def exact_install_sh(names: list[str], reference_package: str) -> str:
    """Install `names` at the installed `reference_package`'s upstream version (read on the host once it is
    installed), their locks lifted for it and put back (the stage holds them all)."""
    quoted = " ".join(shlex.quote(n) for n in names)
    specs = " ".join(f"{shlex.quote(n)}-\"$v\"*" for n in names)
    return (f"v=$({upstream_sh(reference_package)}) && [ -n \"$v\" ] && "
            f"{{ dnf -y -q versionlock delete {quoted} >/dev/null 2>&1; true; }} && "
            f"dnf -y -q install --allowerasing {specs} && dnf -y -q versionlock add {quoted}")

