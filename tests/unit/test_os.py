"""The OS seam (modelfleet.host.os): the data names each release's family and vendor repositories once, every family it
names keeps the contract the stages use, and no module outside modelfleet/host/os speaks a package manager."""

from __future__ import annotations

import ast
import re

import pytest

from modelfleet import PACKAGE_DIR
from modelfleet.host import os as osfam

# What a family module defines (modelfleet/host/os/__init__.py's docstring): the stages call nothing else.
CONTRACT = ("NAME", "packages", "held", "repo_package", "key_fetched", "in_archive", "missing", "repository",
            "source_urls", "cuda_repository", "amd_repository", "upstream", "upstream_sh", "exact_install_sh",
            "PACKAGE_STATE_SH", "REBOOT_SH", "reboot_asks", "reboot_needed", "upgrades_config", "names",
            "SOURCE_KIND", "OWN_SOURCES")
# The modules that ask a family something, and how they name it there.
CALLERS = ("run/stages/gpu_driver.py", "run/stages/gpu_stack.py", "run/stages/container_runtime.py",
           "run/stages/os_base.py", "run/stages/router.py", "fleet/urls.py", "host/host_record.py",
           "host/facts/state.py", "run/context.py")
ASKED = re.compile(r"\b(?:fam|d\.os|self\.os|osfam\.(?:family|by_name)\([^()]*\))\.(\w+)")
ROLES = ("base", "kernel_headers", "router_base", "router_firewall", "distro_docker", "docker", "docker_holds",
         "nvidia_driver", "nvidia_pinning", "fabric_manager", "cuda_toolkit")
# A package manager's words: its commands and the paths it reads.
PACKAGE_MANAGER = re.compile(r"\b(apt-get|apt-mark|apt-cache|dpkg(-query|-deb)?|dnf|yum|rpm)\b|/etc/apt\b|"
                             r"sources\.list|/etc/yum\.repos\.d")


@pytest.mark.parametrize("name", sorted(osfam.table()["families"]))
def test_every_family_keeps_the_contract(name):
    family = osfam.by_name(name)
    assert family.NAME == name
    assert [n for n in CONTRACT if not hasattr(family, n)] == []
    data = osfam.family_data(name)
    assert data["ids"] and data["source"]
    assert [r for r in ROLES if r not in data["packages"]] == []
    assert set(data["arches"]) == set(osfam.cuda_arches())


def test_the_stages_ask_a_family_only_what_the_contract_names():
    """apt's notions (a suite, components, `$(ARCH)`, a reboot file's path) are no stage's business."""
    asked = {(rel, name) for rel in CALLERS for name in ASKED.findall((PACKAGE_DIR / rel).read_text())}
    assert {name for _, name in asked} - {"names"}, "the pattern finds the stages' calls"
    assert sorted((rel, name) for rel, name in asked if name not in CONTRACT) == []


def test_every_release_names_a_family_and_debians_a_codename():
    for release in osfam.table()["releases"]:
        assert release["family"] in osfam.table()["families"], release
        assert release["id"] in osfam.family_data(release["family"])["ids"], release
        assert isinstance(release["version_id"], str), release
        # Docker's apt repository names its suite by the codename; RHEL and its rebuilds have none
        assert release.get("codename") or release["family"] != "debian", release


def test_hosts_find_their_family_by_their_os_release_id():
    assert osfam.family({"id": "ubuntu", "version_id": "24.04"}).NAME == "debian"
    assert osfam.family({"id": "debian"}).NAME == "debian"
    # Unknown or not probed: the default family, as every host was treated before the seam.
    assert osfam.family({"id": "plan9"}).NAME == osfam.family(None).NAME == osfam.table()["default_family"]
    with pytest.raises(KeyError, match="no family 'plan9'"):
        osfam.by_name("plan9")


def test_the_release_tables_answer_as_the_stages_had_them():
    debian = [(i, v) for i, v in osfam.releases("cuda") if osfam.family({"id": i}).NAME == "debian"]
    assert debian == [("ubuntu", "22.04"), ("ubuntu", "24.04"), ("debian", "12")]
    assert [osfam.release({"id": i, "version_id": v})["cuda"] for i, v in debian] == \
        ["ubuntu2204", "ubuntu2404", "debian12"]
    # AMD publishes amdgpu-install per Ubuntu release; Debian 12 takes jammy's.
    assert [osfam.release({"id": i, "version_id": v})["amdgpu"] for i, v in osfam.releases("amdgpu")
            if (i, v) in debian] == ["jammy", "noble", "jammy"]
    assert [osfam.codename(i, v) for i, v in debian] == ["jammy", "noble", "bookworm"]
    assert osfam.cuda_arches() == {"x86_64": "x86_64", "aarch64": "sbsa"}
    assert osfam.supported("cuda").startswith("Ubuntu 22.04, 24.04, Debian 12, RHEL 9.4, 9.6, 10.0, ")
    assert osfam.release({"id": "ubuntu", "version_id": "20.04"}) is None


def _code_strings(tree: ast.Module) -> list[ast.Constant]:
    """String constants a module runs with: not docstrings, not a setting's `description=` (user-facing text)."""
    prose = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant):
            prose.add(id(body[0].value))
        if isinstance(node, ast.keyword) and node.arg == "description":
            prose |= {id(n) for n in ast.walk(node.value)}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in prose]


def test_no_module_outside_the_seam_speaks_a_package_manager():
    """Commands and paths of a package manager live in modelfleet/host/os only (code and host programs, not prose)."""
    found = []
    for path in sorted(PACKAGE_DIR.rglob("*")):
        rel = path.relative_to(PACKAGE_DIR)
        if rel.parts[:2] == ("host", "os") or path.suffix not in (".py", ".sh", ".j2"):
            continue
        if path.suffix == ".py":
            tree = ast.parse(path.read_text())
            found += [f"{rel}:{n.lineno}" for n in _code_strings(tree) if PACKAGE_MANAGER.search(n.value)]
            found += [f"{rel}: imports {a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                      and n.module == "pyinfra.operations" for a in n.names if a.name in ("apt", "dnf", "yum")]
        else:
            found += [f"{rel}:{i}" for i, line in enumerate(path.read_text().splitlines(), 1)
                      if not line.lstrip().startswith("#") and PACKAGE_MANAGER.search(line)]
    assert found == []


def test_the_seam_check_sees_what_it_guards(tmp_path):
    """The check above flags a command in code and leaves prose alone."""
    tree = ast.parse('"""uses apt-get"""\nCMD = "apt-get install x"\nF(description="`apt-mark hold`")\n')
    assert [n.value for n in _code_strings(tree) if PACKAGE_MANAGER.search(n.value)] == ["apt-get install x"]
