"""`modelfleet urls`: the preview lists exactly the outside URLs the stages use. Checked against the stages
themselves: the GPU stack run dry on a bare @fake host of every OS release and architecture it supports (every
URL in its commands and in the source lists it uploads), the pins the pipeline resolves before any stage (each
image's registry as digest pinning reaches it, the checkpoint's hub or mirror), all without a connection."""

import json
import re
import socket
import subprocess
import sys

import pytest

from modelfleet.base import registry  # noqa: E402
from modelfleet.fleet import urls
from modelfleet.host import os as osfam  # noqa: E402
from modelfleet.plan import checkpoint, pins
from modelfleet.plan.checkpoint import Snapshot  # noqa: E402
from modelfleet.plan.inventory import open_inventory, resolve  # noqa: E402
from modelfleet.run.pipeline import run_stages  # noqa: E402
from modelfleet.run.stages import gpu_stack, preflight  # noqa: E402

URL = re.compile(r"(?:https?|file)://[^\s'\"]+")
STACK_KINDS = ("package", "apt repository", "dnf repository", "signing key")
HOSTS = {"nvidia": {"hardware": "h200", "gpu_count": 8, "model": "kimi-k2-thinking", "engine": "vllm"},
         "amd": {"hardware": "mi355x", "gpu_count": 8, "model": "kimi-k3", "engine": "vllm"}}
DF = ["Filesystem 1-blocks Used Available Capacity Mounted on",
      "/dev/md0 30000000000000 1000000000 29000000000000 1% /srv"]


@pytest.fixture(autouse=True)
def reports(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))


def os_release(fake, system: dict) -> list[str]:
    """/etc/os-release as the release writes it (the recorded H200 host for Ubuntu 24.04)."""
    if (system["id"], system["version_id"]) == ("ubuntu", "24.04"):
        return fake.recorded(fake.H200 / "os-release.txt")
    return [f'PRETTY_NAME="{system["pretty_name"]}"', f"ID={system['id']}", f'VERSION_ID="{system["version_id"]}"',
            *([f"VERSION_CODENAME={system['codename']}"] if system["codename"] else [])]


def stack_only():
    run_stages(preflight, gpu_stack)


def stage_urls(state, name: str, arch: str) -> tuple[set[str], list[str]]:
    """Every URL in the commands a dry run would send and in the files it would upload (apt's $(ARCH) and dnf's
    $basearch as the host's package manager names its architecture, as they read a source file; dnf's
    $releasever stays, as the preview leaves it); and the commands."""
    from pyinfra.context import ctx_host, ctx_state

    host = state.inventory.get_host(f"@fake/{name}")
    texts = []
    with ctx_state.use(state), ctx_host.use(host):
        for op_hash in state.get_op_order():
            for command in state.get_op_data_for_host(host, op_hash).command_generator():
                if getattr(command, "function", None):
                    continue
                if hasattr(command, "dest"):
                    texts.append(command.src.getvalue().decode())
                else:
                    texts.append(command.get_masked_value())
    found = {u.replace("$(ARCH)", arch).replace("$basearch", arch) for text in texts for u in URL.findall(text)}
    return found, texts


SYSTEMS = [(vendor, system) for vendor in ("nvidia", "amd") for system in urls.stack_systems(vendor)]


@pytest.mark.parametrize("vendor,system", SYSTEMS, ids=[f"{v}-{s['id']}{s['version_id']}-{s['arch']}"
                                                        for v, s in SYSTEMS])
def test_the_gpu_stack_uses_exactly_the_urls_the_preview_lists(fake, vendor, system):
    data = {**HOSTS[vendor], "pool": "p", "revision": "e" * 40}
    os_lines = os_release(fake, system) + ["KERNEL_RELEASE=6.8.0-87-generic", f"MACHINE_ARCH={system['arch']}"]
    probe = fake.probe_reply({"os": os_lines, "disk": DF, "ports": []})
    state = fake.run_fake([("n1", {**data, "fake_responses": {"@@modelfleet-probe": probe}})], stack_only, dry=True)
    arch = osfam.family_data(osfam.family_name(system))["arches"][system["arch"]]  # the package manager's name
    used, commands = stage_urls(state, "n1", arch)
    assert used, "the dry run used no URL: the fake host was not bare"
    label = f"{system['id']}-{system['version_id']} {system['arch']}"
    preview = urls.outside_urls(resolve([("n1", data)]), ["n1"])
    # A source file naming the key the stack fetched to the host (dnf's gpgkey=file://) names no outside URL.
    keys = {"file://" + e_what.split(",")[0] for e in preview if e["kind"] == "signing key" for e_what in e["what"]}
    used -= keys
    listed = {e["url"] for e in preview if e["kind"] in STACK_KINDS and label in e["os"]}
    assert listed == used
    # The container check's image: pulled by the host from the registry the preview names.
    [check] = [e for e in preview if e["kind"] == "registry" and e["used_by"] == "hosts (pull)"]
    image = check["what"][0].split(": ", 1)[1]
    assert any(f" {image} " in c for c in commands)
    assert check["url"] == registry.base_url(registry.split_reference(image)[0])


def test_the_preview_filters_by_release_and_architecture():
    result = resolve([("n1", {**HOSTS["nvidia"], "pool": "p", "revision": "e" * 40})])
    entries = urls.outside_urls(result, ["n1"], only_os=("debian-12",), arches=("aarch64",))
    systems = {label for e in entries for label in e["os"]}
    assert systems == {"debian-12 aarch64"}
    assert any(e["url"].endswith("/debian12/sbsa/") for e in entries if e["kind"] == "apt repository")


def pins_asked(result, monkeypatch) -> tuple[list, list, list]:
    """What the pins ask for, inside a pyinfra run of this inventory (the pipeline's pins, the model stage's
    checkpoints): (image, plain-HTTP registries) per digest, snapshot arguments per checkpoint, URLs opened."""
    from pyinfra.api import Config, Inventory, State
    from pyinfra.context import ctx_state

    images, checkpoints, opened = [], [], []

    def resolve_(image, insecure, config):
        images.append((image, insecure))
        return "sha256:" + "0" * 64

    def snapshot(repo, revision, endpoint, token_env, source=None):
        checkpoints.append((repo, revision, endpoint, source))
        if source:
            return checkpoint._from_mirror(repo, revision, source)
        return Snapshot(repo=repo, revision=revision, commit="f" * 40, files={})

    def urlopen(url, timeout=None):
        opened.append(url)
        raise OSError("nothing is reached in this test")

    monkeypatch.setattr(registry, "_resolve", resolve_)
    monkeypatch.setattr(pins, "snapshot", snapshot)
    monkeypatch.setattr(checkpoint.urllib.request, "urlopen", urlopen)
    state = State(Inventory(([(name, result.data[name]) for name in result.hosts], {})), Config())
    with ctx_state.use(state):
        for plan in result.hosts.values():
            pins.problems(plan)  # before any stage: digests, commits
            for svc in plan.services:  # the model stage's checkpoint: every file's size and checksum
                try:
                    pins.checkpoint_of(plan, svc)
                except checkpoint.ModelSourceError:
                    pass
    return images, checkpoints, opened


def test_registries_and_hub_are_what_the_pins_reach(monkeypatch):
    data = {"dcgm_exporter": True, "image_registry": "registry.site:5000",
            "insecure_registries": ["registry.site:5000"]}
    result = open_inventory("inventories/prod.py", data=data)
    assert result.errors == [] and result.data
    images, checkpoints, _ = pins_asked(result, monkeypatch)
    assert images and checkpoints
    preview = urls.outside_urls(result, list(result.hosts))
    pinned_registries = {registry.base_url(registry.split_reference(image)[0], insecure)
                         for image, insecure in images}
    assert pinned_registries == {e["url"] for e in preview if e["kind"] == "registry"
                                 and e["used_by"].startswith("control node")}
    assert pinned_registries == {"http://registry.site:5000/v2/", "https://nvcr.io/v2/"}  # dcgm: named in full
    assert {endpoint for _, _, endpoint, _ in checkpoints} == {
        e["url"] for e in preview if e["kind"] == "hub" and e["used_by"] == "control node"}


def test_the_mirror_url_is_where_the_manifest_is_read(monkeypatch):
    commit = "c" * 40
    data = {"model_source": "https://mirror.site/models", "revision": commit}
    result = open_inventory("inventories/prod.py", data=data)
    assert result.errors == []
    _, checkpoints, opened = pins_asked(result, monkeypatch)
    assert opened and all(source == "https://mirror.site/models" for *_, source in checkpoints)
    preview = urls.outside_urls(result, list(result.hosts))
    mirrors = {e["url"] for e in preview if e["kind"] == "checkpoint mirror"}
    assert not [e for e in preview if e["kind"] in ("hub", "pip index") and "huggingface_hub" in str(e["what"])]
    assert mirrors and all(any(url.startswith(m) for m in mirrors) for url in opened)
    assert {url.rsplit("/", 1)[0] + "/" for url in opened} == mirrors


def test_nothing_is_connected_to(monkeypatch):
    result = open_inventory("inventories/prod.py")

    def refuse(*args, **kwargs):
        raise AssertionError("the preview opened a connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    entries = urls.outside_urls(result, list(result.hosts))
    assert {e["kind"] for e in entries} >= {"package", "apt repository", "signing key", "registry", "hub",
                                             "pip index", "distribution archive"}


@pytest.mark.slow
def test_the_command_prints_urls_and_origins():
    run = subprocess.run([sys.executable, "-m", "modelfleet.cli", "urls", "inventories/prod.py", "--json",
                          "--os", "ubuntu-24.04", "--arch", "x86_64", "--limit", "b300-01"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert all(e["hosts"] == ["b300-01"] for e in out["urls"])
    assert "https://developer.download.nvidia.com:443" in out["origins"]
    assert "https://huggingface.co:443" in out["origins"]
    text = subprocess.run([sys.executable, "-m", "modelfleet.cli", "urls", "inventories/prod.py"],
                          capture_output=True, text=True)
    assert text.returncode == 0 and "origins to allow: " in text.stdout


def test_a_front_doors_router_comes_from_the_sites_index_where_one_is_set(monkeypatch):
    """router_pip_index_url on the router host: the site's index is listed for the router, not PyPI."""
    from tests.helpers.front_doors import KEY, fleet

    monkeypatch.setenv("MF_ROUTER_KEY", KEY)
    hosts = fleet("sglang")
    default = resolve(hosts)
    assert default.errors == []
    listed = {e["url"] for e in urls.outside_urls(default, list(default.hosts)) if e["kind"] == "pip index"
              and e["used_by"] == "hosts (front doors)"}
    assert listed == {urls.PIP_DEFAULT_INDEX}
    hosts[0] = (hosts[0][0], {**hosts[0][1], "router_pip_index_url": "https://pypi.site.example/simple"})
    site = resolve(hosts)
    assert site.errors == []
    entries = [e for e in urls.outside_urls(site, list(site.hosts)) if e["kind"] == "pip index"
               and e["used_by"] == "hosts (front doors)"]
    assert [e["url"] for e in entries] == ["https://pypi.site.example/simple"], entries
    assert "https://pypi.site.example:443" in urls.origins(entries)
