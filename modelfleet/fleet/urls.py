"""Every outside URL a run will use, without connecting to anything (`modelfleet urls`): what an air-gapped site
must mirror or let through its firewall. Asked of the stages' own decisions for a bare host of each OS release
the GPU stack supports, the images the units and checks run, and the checkpoint source."""

from __future__ import annotations

import urllib.parse

from modelfleet.base.registry import base_url, insecure_of, split_reference
from modelfleet.host import os as osfam
from modelfleet.plan import router
from modelfleet.plan.inventory.plan import HostPlan, Resolved
from modelfleet.run.stages import container_runtime, exporters, gpu_driver, os_base
from modelfleet.run.stages import model as model_stage
from modelfleet.run.stages import router as router_stage

# pip's own default index: what a host's `pip install` reaches unless its pip.conf names another.
PIP_DEFAULT_INDEX = "https://pypi.org/simple/"
FRONT_DOOR = "front door"  # an entry clients reach (inbound), not one a firewall lets out


def known_systems() -> list[str]:
    """Every `ID-VERSION` the GPU stack installs on (either vendor), as `urls --os` takes them."""
    return sorted({f"{os_id}-{version}" for os_id, version in {*osfam.releases("cuda"), *osfam.releases("amdgpu")}})


def stack_systems(vendor: str, only: tuple[str, ...] = (), arches: tuple[str, ...] = ()) -> list[dict]:
    """The OS releases and architectures the GPU stack installs on for `vendor`, as preflight's probe reports
    them (`only`: e.g. ("ubuntu-24.04",); `arches`: e.g. ("x86_64",))."""
    if vendor == "amd":
        releases, machine = osfam.releases("amdgpu"), ["x86_64"]  # amdgpu's lists are arch=amd64
    else:
        releases, machine = osfam.releases("cuda"), list(osfam.cuda_arches())
    return [{"id": os_id, "version_id": version, "arch": arch, "codename": osfam.codename(os_id, version),
             "pretty_name": f"{os_id} {version}"}
            for os_id, version in releases for arch in machine
            if (not only or f"{os_id}-{version}" in only) and (not arches or arch in arches)]


class _Found:
    """The URLs found so far, one entry per (url, kind, used_by), naming what uses it, the hosts and the OSes."""

    def __init__(self):
        self.entries: dict[tuple, dict] = {}

    def add(self, url, kind, what, used_by, host, system=None) -> None:
        entry = self.entries.setdefault((url, kind, used_by), {"url": url, "kind": kind, "what": [],
                                                               "used_by": used_by, "hosts": [], "os": []})
        if what not in entry["what"]:
            entry["what"].append(what)
        if host not in entry["hosts"]:
            entry["hosts"].append(host)
        label = f"{system['id']}-{system['version_id']} {system['arch']}" if system else None
        if label and label not in entry["os"]:
            entry["os"].append(label)


def outside_urls(result: Resolved, names: list[str], only_os: tuple[str, ...] = (),
                 arches: tuple[str, ...] = ()) -> list[dict]:
    """Every outside URL a run over the named hosts uses, without connecting to anything: asked of the stages'
    own decisions (a bare host of each OS release the stack supports, or `only_os`), the images the units and
    checks run, and the checkpoint source. Each entry: url (None for what the hosts' own configuration names),
    kind, what, used_by, hosts, os."""
    found = _Found()
    insecure = insecure_of(result.data.values())
    for name in names:
        plan = result.hosts[name]
        for system in (stack_systems(plan.hardware.vendor, only_os, arches) if plan.stack_ours else []):
            _stack(found, plan, system)
        _images(found, plan, insecure)
        _checkpoints(found, result, plan, set(names))
        _front_doors(found, plan)
    return list(found.entries.values())


def _stack(found: _Found, plan: HostPlan, system: dict) -> None:
    """What the GPU stack's stages would install on a bare host of `system`: the vendors' repositories and keys,
    and the distribution's own packages."""
    name, probe, fam = plan.name, {"os": system}, osfam.family(system)
    driver = gpu_driver.decide(plan, probe, {"packages": {}})
    runtime = container_runtime.decide(plan, probe, {"texts": {}, "paths": {}, "units": {}})
    if driver.repo_package_url:
        found.add(driver.repo_package_url, "package", f"{driver.repo_package} (the vendor's repository and key)",
                  "hosts", name, system)
    if driver.repo_key:
        found.add(driver.repo_key[1], "signing key", f"{driver.repo_key[2]}, for "
                  f"{', '.join(path for path, _ in driver.sources)}", "hosts", name, system)
    for list_path, content in driver.sources:
        for url, what in fam.source_urls(content, system["arch"]):
            found.add(url, fam.SOURCE_KIND, f"{list_path} ({what})", "hosts", name, system)
    for repo in runtime.repositories:
        for list_path, content in repo.sources:
            found.add(repo.key_url, "signing key", f"{repo.key}, for {list_path}", "hosts", name, system)
            for url, what in fam.source_urls(content, system["arch"]):
                found.add(url, fam.SOURCE_KIND, f"{list_path} ({what})", "hosts", name, system)
    packages = list(os_base.base_packages(plan, {**system, "kernel": "<kernel>"}, builds_module=driver.builds_module))
    packages += [p for p in runtime.packages if p == "docker.io"]
    found.add(None, "distribution archive", ", ".join(packages), f"hosts ({fam.OWN_SOURCES})", name, system)


def _images(found: _Found, plan: HostPlan, insecure) -> None:
    """The registries of the images the host's units and checks run."""
    images = [(svc.image, "control node (digest) and hosts (pull)", f"engine image of pool {svc.pool}")
              for svc in plan.services if not svc.venv]
    for svc in plan.services:  # a venv engine: its index, unless the control node pushes a wheelhouse
        if svc.venv and not svc.venv.wheelhouse:
            found.add(svc.venv.index_url or "the host's pip settings", "package index",
                      f"venv of pool {svc.pool} ({svc.venv.lock_file})", "hosts (pip)", plan.name)
    if exporters.enabled(plan):
        images.append((plan.dcgm_exporter_image, "control node (digest) and hosts (pull)", "DCGM exporter"))
    passthrough = plan.services[0].gpu_passthrough if plan.services else True
    if plan.stack_ours and passthrough:
        images.append((plan.stack.gpu_check_image, "hosts (pull)", "GPU check after the stack"))
    for image, used_by, why in images:
        found.add(base_url(split_reference(image)[0], insecure), "registry", f"{why}: {image.partition('@')[0]}",
                  used_by, plan.name)


def _checkpoints(found: _Found, result: Resolved, plan: HostPlan, chosen: set[str]) -> None:
    """Where the host's checkpoints come from: the site's mirror, else the hub (the files only to the first
    host of each checkpoint group, with the hub client pip installs there)."""
    name = plan.name
    for svc in plan.services:
        members = [h for h, p in result.hosts.items() if h in chosen and any(
            s.checkpoint_group == svc.checkpoint_group and s.model.id == svc.model.id for s in p.services)]
        revision = svc.revision or "main"
        if plan.model_source:
            found.add(f"{plan.model_source.rstrip('/')}/{svc.hf_repo}/{revision}/", "checkpoint mirror",
                      f"{svc.hf_repo}@{revision}", "control node (manifest)", name)
            if members and members[0] == name:
                found.add(f"{plan.model_source.rstrip('/')}/{svc.hf_repo}/{revision}/", "checkpoint mirror",
                          f"{svc.hf_repo}@{revision}", "hosts (files, the first of each checkpoint group)", name)
            continue
        found.add(plan.hf_endpoint, "hub", f"{svc.hf_repo}@{revision} (commit and checksums)", "control node", name)
        if members and members[0] == name:
            found.add(plan.hf_endpoint, "hub", f"{svc.hf_repo}@{revision} (files; the hub may redirect them to its "
                      "storage)", "hosts (the first of each checkpoint group)", name)
            found.add(PIP_DEFAULT_INDEX, "pip index", f"{model_stage.HF_CLIENT} (pip's default; a host's pip.conf "
                      "may name another)", "hosts (the first of each checkpoint group)", name)


def _front_doors(found: _Found, plan: HostPlan) -> None:
    """A front door's packages and its router from pip."""
    if plan.routers:
        found.add(None, "distribution archive", ", ".join(router_stage.wanted_packages(plan)),
                  f"hosts ({osfam.family(None).OWN_SOURCES})", plan.name)
    for rp in plan.routers:
        # The one URL here clients come in by (never an outside one to let out): by router_server_name.
        found.add(f"{rp.base_url}/v1", FRONT_DOOR,
                  f"{rp.served_name} for clients ({'TLS' if rp.tls else 'plain HTTP'})", "clients (inbound)",
                  plan.name)
        spec = router.spec(rp)
        if plan.router_pip_index_url:
            found.add(plan.router_pip_index_url, "pip index", f"{spec.package}=={spec.version} and its dependencies "
                      "(router_pip_index_url; each wheel's sha256 from the catalog's lock)", "hosts (front doors)",
                      plan.name)
            continue
        found.add(PIP_DEFAULT_INDEX, "pip index", f"{spec.package}=={spec.version} (pip's default; a host's "
                  "pip.conf may name another)", "hosts (front doors)", plan.name)


def origins(entries: list[dict]) -> list[str]:
    """scheme://host:port of every URL: what a firewall must let through."""
    out = []
    for entry in entries:
        if not entry["url"] or entry["kind"] == FRONT_DOOR:
            continue
        parts = urllib.parse.urlsplit(entry["url"])
        if parts.scheme == "file":
            continue
        port = parts.port or {"https": 443, "http": 80}.get(parts.scheme)
        origin = f"{parts.scheme}://{parts.hostname}:{port}"
        if origin not in out:
            out.append(origin)
    return out
