"""Stage gpu_driver: the GPU driver from its vendor's repository, held on its branch (or at the release
`driver_version` names: changing it is a driver upgrade, `modelfleet upgrade` rolls it batch by batch).

NVIDIA: the CUDA network repository (Debian family: through its `cuda-keyring` package; arch x86_64 or sbsa),
the driver branch's metapackage (open kernel modules by default), NVIDIA's pinning package for the branch (else
a hold), `cuda-toolkit-X-Y` only where asked, nvidia-persistenced enabled. Where NVSwitch needs it,
Fabric Manager (and the board's extra packages: nvlsm, nvidia-imex) at exactly the driver's version, held.
Under UEFI Secure Boot (preflight reads it) a DKMS module is refused before anything is installed, unless its key
is enrolled; on Ubuntu `driver_source` (auto there) takes Canonical's signed modules for the running kernel
instead (modelfleet/host/secure_boot.py), once the archive is seen to have them.
AMD: ROCm through `amdgpu-install` (repository version from data), `amdgpu-dkms` and `rocm`, the service
user in `render` and `video`.

Skips cleanly when the wanted branch is already loaded; refuses a newer loaded driver unless downgrade is
allowed. Reboots only when the kernel module changes, one host at a time (`_serial`), confirmed by a new
boot and a GPU check; `reboot: false` records "reboot pending" instead and stops the host's serving stages.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from pyinfra import host
from pyinfra.api import StringCommand, deploy, operation

from modelfleet.base.host_commands import (
    amd_gpu_count_sh,
    driver_version_sh,
    fabric_manager_version_sh,
    nvidia_gpu_count_sh,
    program,
)
from modelfleet.host import os as osfam
from modelfleet.host import secure_boot
from modelfleet.host.operations.files import content_file
from modelfleet.host.operations.reboot import reboot_and_wait
from modelfleet.host.operations.report import fail_host
from modelfleet.host.operations.service import unit_running
from modelfleet.plan import trust
from modelfleet.plan.gpu_predicates import branch_of, fabric_manager_needed, loaded_driver, replaces_driver
from modelfleet.plan.inventory.plan import HostPlan
from modelfleet.run.context import HostRun

NAME = "gpu_driver"  # a part of the gpu_stack stage

# Which release takes which of NVIDIA's and AMD's repositories: catalog/os.yaml (modelfleet.host.os).
PERSISTENCED = "nvidia-persistenced.service"
FABRIC_MANAGER = "nvidia-fabricmanager.service"
GROUP_FILE = "/etc/group"


@dataclass
class DriverPlan:
    """What this host's driver needs, decided before the run from preflight's probe and the host state."""

    vendor: str
    problems: list[str] = field(default_factory=list)
    family: str = ""  # the host's OS family (modelfleet.host.os), which speaks the package manager
    repo_package: str | None = None  # cuda-keyring / amdgpu-install, from a package at repo_package_url
    repo_package_url: str | None = None
    repo_keyring: tuple[str, str] | None = None  # (repository, keyring path inside the package): checked first
    repo_key: tuple[str, str, str] | None = None  # (repository, key URL, key path): a key fetched and checked
    sources: list[tuple[str, str]] = field(default_factory=list)  # (source file, content) with the configured URL
    packages: dict[str, str | None] = field(default_factory=dict)
    hold: list[str] = field(default_factory=list)
    exact: list[str] = field(default_factory=list)  # installed at exactly the driver's version (FM, IMEX)
    exact_version: str | None = None  # known before the run, else read from the installed driver package
    driver_package: str | None = None
    units: list[str] = field(default_factory=list)
    restart_units: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    reboot: bool = False
    reboot_reason: str = ""
    loaded: str | None = None
    allowed_reboot: bool = True
    builds_module: bool = False  # a kernel module is built here (DKMS): os_base installs the kernel headers
    source: str = "cuda"  # where the NVIDIA module comes from: the CUDA repository's DKMS, or ubuntu-signed
    signed_modules: str | None = None  # Canonical's signed module package, checked in the archive first
    signed_refusal: str = ""  # what the host is told when the archive has none for its kernel
    from_archive: set[str] = field(default_factory=set)  # packages of the distribution's archive, not the vendor's

    @property
    def pending(self) -> bool:
        """The new module is installed but not loaded, and the inventory said not to reboot."""
        return self.reboot and not self.allowed_reboot

    @property
    def os(self):
        return osfam.by_name(self.family)

    def _packages_installed(self, installed: dict) -> list[str]:
        exact = self.exact if not self.exact_version else list(
            self.os.missing(dict.fromkeys(self.exact, self.exact_version), installed))
        return [*self.os.missing(self.packages, installed), *exact]

    def installs(self, installed: dict) -> list[str]:
        """The packages this plan installs on a host with `installed` (the repository's own package included)."""
        from_repo = [p for p in self._packages_installed(installed) if p not in self.from_archive]
        return ([self.repo_package] if from_repo and self.repo_package and not installed.get(self.repo_package)
                else []) + self._packages_installed(installed)


# Over 60 lines: one decision read top to bottom, each refusal returning where it is found (repository, branch,
# Secure Boot, DKMS); what differs by OS family already comes from the family (modelfleet/host/os), AMD's from
# _decide_amd, and the repository from _repository.
def decide(plan: HostPlan, probe: dict, state: dict) -> DriverPlan:
    """Pure: the rules in the module docstring, for one host."""
    stack, hw = plan.stack, plan.hardware
    if not plan.stack_ours:
        return DriverPlan(vendor="none")
    os_info = probe.get("os") or {}
    fam = osfam.family(os_info)
    if hw.vendor == "amd":
        return _decide_amd(plan, probe, state)
    out = DriverPlan(vendor="nvidia", allowed_reboot=stack.reboot, family=fam.NAME)
    key = (os_info.get("id"), os_info.get("version_id"))
    distro, arch = (osfam.release(os_info) or {}).get("cuda"), osfam.cuda_arches().get(os_info.get("arch") or "")
    if not distro or not arch:
        out.problems.append(f"os: {os_info.get('pretty_name') or key} on {os_info.get('arch')} has no NVIDIA "
                            f"CUDA repository here (supported: {osfam.supported('cuda')}; "
                            f"{', '.join(osfam.cuda_arches())})")
        return out
    branch = int(stack.driver_branch)
    _repository(out, fam.cuda_repository(stack.nvidia_repo_url, distro, arch, branch,
                                         "-open" if stack.driver_flavor == "open" else ""))
    out.loaded = loaded = loaded_driver(probe)
    if branch_of(loaded) > branch and not stack.driver_allow_downgrade:
        out.problems.append(f"driver_branch: the loaded driver {loaded} is newer than branch {branch}; set "
                            "driver_allow_downgrade: true to install it (needs a reboot)")
        return out
    signed = None
    if secure_boot.driver_source(stack.driver_source, os_info) == "ubuntu-signed":
        signed, problem = secure_boot.signed_driver(branch, stack.driver_flavor == "open", os_info)
        if problem:
            out.problems.append(problem)
            return out
    out.source = "ubuntu-signed" if signed else "cuda"
    if signed:  # known on every run (a converged host's holds are read by these names)
        out.from_archive = {signed.modules, signed.modules_flavour, signed.userspace, signed.utils}
    flavor = "-open" if stack.driver_flavor == "open" else ""
    out.driver_package = signed.userspace if signed else fam.names("nvidia_driver").format(branch=branch, flavor=flavor)
    # A family whose package manager pins the branch another way (a module stream) names no pinning package.
    pinning = fam.names("nvidia_pinning") if stack.driver_pinning and not signed else None
    pinning = pinning.format(branch=branch) if pinning else None
    installed = state["packages"]
    if replaces_driver(plan, probe) and signed:
        # Canonical's module signed for the running kernel (the flavour's package follows its kernel updates),
        # userspace at the release asked for; no DKMS, no kernel headers.
        out.packages.update({signed.modules: None, signed.modules_flavour: None,
                             out.driver_package: stack.driver_version, signed.utils: stack.driver_version})
        out.signed_modules, out.signed_refusal, out.reboot = signed.modules, secure_boot.no_signed_package(signed), True
        out.reboot_reason = f"signed driver {stack.driver_version or f'branch {branch}'} installed, " \
                            f"{loaded or 'no driver'} loaded"
    elif replaces_driver(plan, probe):
        # A release asked for (driver_version) is installed at exactly that version, up or down.
        out.packages.update({**({pinning: None} if pinning else {}), out.driver_package: stack.driver_version})
        out.reboot = out.builds_module = True
        unsigned = secure_boot.dkms_problem(os_info, out.driver_package)
        if unsigned:
            out.problems.append(unsigned)
            return out
        have = installed.get(out.driver_package)
        target = stack.driver_version or (fam.upstream(have["version"]) if have else f"branch {branch}")
        out.reboot_reason = f"driver {target} installed, {loaded or 'no driver'} loaded"
    if stack.cuda_toolkit:
        out.packages[fam.names("cuda_toolkit").format(version=stack.cuda_toolkit)] = None
    if out.driver_package in out.packages or installed.get(out.driver_package):
        # Held even with the pinning package (it pins the branch, not the release): no upgrade (by hand or
        # unattended) moves the libraries under a running engine. (A driver installed another way,
        # e.g. the .run file, is not ours to hold.)
        out.hold.append(out.driver_package)
        if signed:  # the module for this kernel and the tools at the driver's release stay with it
            out.hold += [signed.utils, signed.modules, signed.modules_flavour]
    out.units.append(PERSISTENCED)
    if fabric_manager_needed(plan, probe):
        fm = fam.names("fabric_manager").format(branch=branch)
        extras = [p.format(branch=branch) for p in hw.extra_packages]
        out.exact = [fm] + [p for p in extras if str(branch) in p]
        out.packages.update({p: None for p in extras if str(branch) not in p})
        out.hold += out.exact
        out.units.append(FABRIC_MANAGER)
        # Known now when the wanted branch is loaded; else it is whatever driver this run installs.
        out.exact_version = stack.driver_version or (loaded if not out.reboot else None)
        if out.exact_version and fam.missing({p: out.exact_version for p in out.exact}, installed):
            out.restart_units.append(FABRIC_MANAGER)
    return _repository_if_needed(out, installed)


def _repository(out: DriverPlan, repo: osfam.Repository) -> None:
    out.repo_package, out.repo_package_url, out.sources = repo.package, repo.package_url, repo.sources
    out.repo_keyring = (repo.repo, repo.keyring) if repo.keyring else None
    out.repo_key = (repo.repo, repo.key_url, repo.key) if repo.key_url else None


def _repository_if_needed(out: DriverPlan, installed: dict) -> DriverPlan:
    """A host with nothing to install from the vendor's repository gets no repository: skipping cleanly (the
    signed driver comes from the distribution's archive)."""
    if not [p for p in out._packages_installed(installed) if p not in out.from_archive]:
        out.repo_package = out.repo_package_url = out.repo_keyring = out.repo_key = None
        out.sources = []
    return out


def _decide_amd(plan: HostPlan, probe: dict, state: dict) -> DriverPlan:
    stack, os_info = plan.stack, probe.get("os") or {}
    fam = osfam.family(os_info)
    out = DriverPlan(vendor="amd", allowed_reboot=stack.reboot, family=fam.NAME)
    release = (osfam.release(os_info) or {}).get("amdgpu")
    if not release:
        key = (os_info.get("id"), os_info.get("version_id"))
        out.problems.append(f"os: {key} has no amdgpu-install package (supported: {osfam.supported('amdgpu')})")
        return out
    _repository(out, fam.amd_repository(stack.amd_repo_url, stack.rocm_version, release,
                                         stack.amdgpu_install_build))
    out.packages = {"amdgpu-dkms": None, "rocm": None}
    # A new amdgpu-dkms needs a boot; so does one installed by an earlier run that amd-smi cannot see yet.
    if not state["packages"].get("amdgpu-dkms"):
        out.reboot, out.reboot_reason, out.builds_module = True, "amdgpu-dkms installed (new kernel module)", True
        unsigned = secure_boot.dkms_problem(os_info, "amdgpu-dkms")
        if unsigned:
            out.problems.append(unsigned)
            return out
    elif not probe.get("amd_gpus"):
        out.reboot, out.reboot_reason = True, "amdgpu-dkms installed, amd-smi lists no GPU (module not loaded)"
    out.groups = ["render", "video"]
    return _repository_if_needed(out, state["packages"])


def _members(group_file: str | None, group: str) -> list[str] | None:
    """Members of `group` in /etc/group's text; None when the group does not exist."""
    for line in (group_file or "").splitlines():
        cells = line.split(":")
        if len(cells) == 4 and cells[0] == group:
            return [m for m in cells[3].split(",") if m]
    return None


@operation()
def in_groups(user: str, groups: list[str], group_file: str | None):
    """The service user in the GPU device groups (AMD: /dev/kfd and /dev/dri belong to render and video)."""
    todo = [g for g in groups if user not in (_members(group_file, g) or [])]
    if not todo:
        host.noop(f"{user} is in {', '.join(groups) or 'the groups it needs'}")
        return
    for group in [g for g in todo if _members(group_file, g) is None]:
        # udev gives /dev/dri/renderD* to `render`; a minimal install may not have made the group yet.
        yield StringCommand("groupadd", "--system", group)
    yield StringCommand("usermod", "-a", "-G", ",".join(todo), user)


@operation()
def at_driver_version(names: list[str], driver_package: str | None, version: str | None, current: dict,
                      family: str | None = None):
    """Fabric Manager (and IMEX) at exactly the driver's version: the usual cause of CUDA error 802 is skew.
    Without `version`: the installed driver package's, read on the host after this run installed it."""
    if not names:
        host.noop("no NVSwitch: Fabric Manager not needed")
        return
    fam = osfam.by_name(family)
    if version:
        yield from fam.packages._inner(wanted={n: version for n in names}, current=current)
        return
    yield StringCommand("sh", "-c", shlex.quote(fam.exact_install_sh(names, driver_package)))


def stack_check_script(plan: HostPlan, fabric: bool) -> str:
    """After the driver work: the GPUs answer at the wanted branch, and Fabric Manager matches the driver."""
    return program("gpu_stack_check", plan.gpu_count, plan.stack.driver_version or f"{plan.stack.driver_branch}.*",
                   "fabric" if fabric else "",
                   functions={"gpu_count": nvidia_gpu_count_sh(), "driver_version": driver_version_sh(),
                              "fabric_manager_version": fabric_manager_version_sh()})


def amd_check_script(plan: HostPlan) -> str:
    """After the driver work: amd-smi lists the inventory's GPU count."""
    return "sh -c " + shlex.quote(f"n=$({amd_gpu_count_sh()}); [ \"$n\" -eq {plan.gpu_count} ] || "
                                  f"{{ echo \"amd-smi lists $n GPUs, inventory says {plan.gpu_count}\"; exit 1; }}")


@operation(is_idempotent=False)
def stack_checked(needed: bool, script: str):
    """Run the post-install GPU check on the host (only after this run changed the driver)."""
    if not needed:
        host.noop("driver unchanged: preflight's view stands")
        return
    yield StringCommand(script)


def wants(plan: HostPlan, probe: dict) -> dict:
    probe = probe
    empty = {"packages": {}, "units": {}, "paths": {}, "texts": {}}
    d = decide(plan, probe, empty)  # with nothing installed: every package and list it may need
    return {"packages": [p for p in [d.repo_package, d.driver_package, *d.packages, *d.exact, *sorted(d.from_archive)]
                         if p],
            "paths": [path for path, _ in d.sources] + ([d.repo_key[2]] if d.repo_key else [])
            + d.os.reboot_asks().get("paths", []) + [conf[0] for conf in [d.os.upgrades_config()] if conf],
            "reboots": d.os.reboot_asks().get("reboots", []), "units": d.units,
            "texts": [GROUP_FILE] if d.groups else []}


@deploy("modelfleet gpu_driver")
def run(ctx: HostRun, decided: DriverPlan | None = None) -> DriverPlan:
    """`decided`: the pipeline's decision, made before os_base (to refuse first); else decided here."""
    plan = ctx.plan
    state = ctx.deployed()
    d = decided or decide(plan, ctx.probe, state)
    if d.problems:  # the pipeline refuses before os_base; this is for the stage run on its own
        fail_host(name="GPU driver: refused", reasons=d.problems)
        return d
    current, fam = state["packages"], d.os
    # Operation names are the same on every host (pyinfra shows one name per operation across hosts).
    repo, keyring = d.repo_keyring or ("", None)
    fam.repo_package(name="Vendor repository package (cuda-keyring / amdgpu-install)", package=d.repo_package,
                     url=d.repo_package_url, current=current, keyring=keyring, repo=repo,
                     fingerprints=trust.expected(plan.stack.repo_key_fingerprints, repo))
    if d.repo_key:  # a family that writes the vendor's source file itself fetches its key (checked) first
        repo, key_url, key = d.repo_key
        fam.key_fetched(name=f"Signing key {key}", url=key_url, dest=key, current=state["paths"].get(key),
                        repo=repo, fingerprints=trust.expected(plan.stack.repo_key_fingerprints, repo))
    for path, content in d.sources:
        content_file(name="Vendor source list", dest=path, content=content, current=state["paths"].get(path))
    fam.packages(name="GPU driver packages", wanted=d.packages, current=current)
    at_driver_version(name="Fabric Manager at the driver's exact version", names=d.exact,
                      driver_package=d.driver_package, version=d.exact_version, current=current, family=d.family)
    fam.held(name="Hold the driver branch", names=d.hold, current=current)
    upgrades = fam.upgrades_config()
    if upgrades:  # the family's automatic updater, where it has one to tell
        conf, content = upgrades
        content_file(name=f"Unattended upgrades leave the GPU stack alone ({conf})", dest=conf, content=content,
                     current=state["paths"].get(conf))
    if d.groups:
        in_groups(name=f"{plan.stack.service_user} in {', '.join(d.groups)}", user=plan.stack.service_user,
                  groups=d.groups, group_file=state["texts"].get(GROUP_FILE))
    for unit in d.units:  # started now only when the driver is loaded; else they start at boot
        unit_running(name=f"Driver daemon {unit}", unit=unit, current=state["units"].get(unit) or {}, reload=False,
                     restart=unit in d.restart_units, start=not d.reboot)
    check = stack_check_script(plan, bool(d.exact)) if d.vendor == "nvidia" else amd_check_script(plan)
    reboot_and_wait(name="Reboot for the new kernel module (one host at a time)",
                    needed=d.reboot and d.allowed_reboot, reason=d.reboot_reason, check_command=check,
                    _serial=True)
    stack_checked(name="GPUs answer at the wanted driver", script=check,
                  needed=bool(d.vendor != "none" and not d.reboot and (fam.missing(d.packages, current) or
                                                                     d.restart_units)))
    return d
