"""Broken and hostile inventories, table-driven: each must end in exit 2 naming the host (or file) and the
field, with no traceback, before anything connects. Kinds: typos, injection, paths, cross-field, secrets,
types, references, files. Plus inventories that look odd but are valid, and the real `pyinfra` command
against a listener that counts connections (none allowed)."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from modelfleet.cli import main
from tests.conftest import ROOT
from tests.helpers.listener import CountingListener

BASE = {"ssh_hostname": "192.0.2.10", "hardware": "h200", "gpu_count": 2, "model": "qwen3-8b", "engine": "vllm"}
DIGEST = "sha256:" + "a" * 64
# A made-up hub token, built here so no token-shaped string sits in the tree.
FAKE_HF_TOKEN = "hf_" + secrets.token_hex(16)
FAKE_API_KEY = "sk-proj-" + secrets.token_hex(12)


def host(**changes) -> dict:
    data = {**BASE, **changes}
    return {k: v for k, v in data.items() if v is not ...}


def svc(**changes) -> dict:
    return {"model": "qwen3-8b", "engine": "vllm", **changes}


# (kind, id, hosts [(name, data)], expected where, expected field); `...` removes a key.
CASES = [
    # typos: unknown keys at every level, with a suggestion
    ("typo", "gpu_cout", [("h1", host(gpu_cout=1))], "host h1", "gpu_cout"),
    ("typo", "modle", [("h1", host(modle="qwen3-8b"))], "host h1", "modle"),
    ("typo", "bind_adress", [("h1", host(bind_adress="127.0.0.1"))], "host h1", "bind_adress"),
    ("typo", "service key", [("h1", host(model=..., engine=..., services=[svc(prot=8000)]))], "host h1", "prot"),
    ("typo", "model_roots", [("h1", host(model_roots="/srv/x"))], "host h1", "model_roots"),
    ("typo", "drvier_branch", [("h1", host(drvier_branch="580"))], "host h1", "drvier_branch"),
    # a host-level service key is every entry's default: one pool given to two entries is one pool twice
    ("typo", "host-level pool for two services", [("h1", host(model=..., engine=..., pool="one",
                                                             services=[svc(), svc(port=8001)]))],
     "host h1", "pool"),
    ("typo", "unknown model", [("h1", host(model="qwen3-8"))], "host h1", "model"),
    ("typo", "unknown engine", [("h1", host(engine="vlm"))], "host h1", "engine"),
    ("typo", "unknown hardware", [("h1", host(hardware="h20"))], "host h1", "hardware"),
    ("typo", "unknown recipe", [("h1", host(recipe="nope"))], "host h1", "recipe"),
    ("typo", "unknown assess model", [("h1", host(assess_models=["nope"]))], "host h1", "assess_models"),
    # injection: a value that would add a line to a unit, env file or config
    ("injection", "served_name newline", [("h1", host(served_name="x\nExecStartPre=/bin/sh"))], "host h1",
     "served_name"),
    ("injection", "extra_args newline", [("h1", host(extra_args=["--seed", "1\nExecStartPre=/bin/sh"]))],
     "host h1", "extra_args"),
    ("injection", "env value newline", [("h1", host(env={"A": "1\nLD_PRELOAD=/tmp/x.so"}))], "host h1", "env"),
    ("injection", "env name", [("h1", host(env={"A B": "1"}))], "host h1", "env"),
    ("injection", "env name newline", [("h1", host(env={"A\nB": "1"}))], "host h1", "env"),
    ("injection", "nccl ifname newline", [("h1", host(nccl_socket_ifname="eth0\nX=1"))], "host h1",
     "nccl_socket_ifname"),
    ("injection", "gloo ifname space", [("h1", host(gloo_socket_ifname="eth0 eth1"))], "host h1",
     "gloo_socket_ifname"),
    ("injection", "ib hca", [("h1", host(nccl_ib_hca="mlx5_0;reboot"))], "host h1", "nccl_ib_hca"),
    ("injection", "pool with space", [("h1", host(pool="my pool"))], "host h1", "pool"),
    ("injection", "pool traversal", [("h1", host(pool="../../etc/x"))], "host h1", "pool"),
    ("injection", "checkpoint group", [("h1", host(checkpoint_group="a/b"))], "host h1", "checkpoint_group"),
    ("injection", "served_name quote", [("h1", host(served_name="a'b"))], "host h1", "served_name"),
    ("injection", "image newline", [("h1", host(image="vllm/vllm-openai:v1\nX"))], "host h1", "image"),
    ("injection", "serial", [("h1", host(format_allow_serials=["S1; rm -rf /"]))], "host h1",
     "format_allow_serials"),
    ("injection", "registry", [("h1", host(image_registry="reg.example.com/$(id)"))], "host h1",
     "image_registry"),
    ("injection", "url space", [("h1", host(hf_endpoint="https://hub example"))], "host h1", "hf_endpoint"),
    ("injection", "url scheme", [("h1", host(model_source="ftp://mirror/x"))], "host h1", "model_source"),
    ("injection", "service user", [("h1", host(service_user="root;id"))], "host h1", "service_user"),
    ("injection", "ssh user", [("h1", host(ssh_user="root\nx"))], "host h1", "ssh_user"),
    # paths
    ("path", "model_root relative", [("h1", host(model_root="models"))], "host h1", "model_root"),
    ("path", "model_root /", [("h1", host(model_root="/"))], "host h1", "model_root"),
    ("path", "config_dir /etc", [("h1", host(config_dir="/etc"))], "host h1", "config_dir"),
    ("path", "config_dir /usr", [("h1", host(config_dir="/usr/"))], "host h1", "config_dir"),
    ("path", "model_root dotdot", [("h1", host(model_root="/srv/../etc"))], "host h1", "model_root"),
    ("path", "model_root proc", [("h1", host(model_root="/proc/models"))], "host h1", "model_root"),
    ("path", "model_root space", [("h1", host(model_root="/srv/my models"))], "host h1", "model_root"),
    ("path", "config_dir /var/lib", [("h1", host(config_dir="/var/lib"))], "host h1", "config_dir"),
    ("path", "config_dir /usr/bin", [("h1", host(config_dir="/usr/bin"))], "host h1", "config_dir"),
    ("path", "config_dir /etc/ssh", [("h1", host(config_dir="/etc/ssh"))], "host h1", "config_dir"),
    ("path", "model_root /var/lib/docker", [("h1", host(model_root="/var/lib/docker", nvme_devices=["auto"]))],
     "host h1", "model_root"),
    ("path", "model_root /boot/efi", [("h1", host(model_root="/boot/efi"))], "host h1", "model_root"),
    ("path", "model_root /home", [("h1", host(model_root="/home"))], "host h1", "model_root"),
    ("path", "revision traversal", [("h1", host(revision="../../../../etc"))], "host h1", "revision"),
    ("path", "revision absolute", [("h1", host(revision="/etc"))], "host h1", "revision"),
    ("path", "revision option", [("h1", host(revision="-rf"))], "host h1", "revision"),
    ("path", "nvme not dev", [("h1", host(nvme_devices=["/tmp/disk"]))], "host h1", "nvme_devices"),
    ("path", "nvme repeated", [("h1", host(nvme_devices=["/dev/nvme0n1", "/dev/nvme0n1"]))], "host h1",
     "nvme_devices"),
    ("path", "nvme relative", [("h1", host(nvme_devices=["nvme0n1"]))], "host h1", "nvme_devices"),
    # cross-field
    ("cross", "gpu_count above board", [("h1", host(gpu_count=9))], "host h1", "gpu_count"),
    ("cross", "services over gpus", [("h1", host(model=..., engine=..., gpu_count=1, services=[
        svc(pool="a", port=8000), svc(pool="b", port=8001)]))], "host h1", "gpus"),
    ("cross", "gpus above host", [("h1", host(gpus=4))], "host h1", "gpus"),
    ("cross", "same port twice", [("h1", host(model=..., engine=..., services=[
        svc(pool="a", port=8000), svc(pool="b", port=8000)]))], "host h1", "port"),
    ("cross", "same pool twice", [("h1", host(model=..., engine=..., services=[
        svc(pool="a", port=8000), svc(pool="a", port=8001)]))], "host h1", "pool"),
    ("cross", "port ssh", [("h1", host(port=22))], "host h1", "port"),
    ("cross", "port custom ssh", [("h1", host(port=2222, ssh_port=2222))], "host h1", "port"),
    ("cross", "port dcgm", [("h1", host(port=9400))], "host h1", "port"),
    ("cross", "port node exporter", [("h1", host(port=9100))], "host h1", "port"),
    ("cross", "port rendezvous", [("h1", host(port=29500))], "host h1", "port"),
    ("cross", "port fan-out", [("h1", host(port=18431))], "host h1", "port"),
    ("cross", "port range", [("h1", host(port=70000))], "host h1", "port"),
    ("cross", "driver too old", [("h1", host(driver_branch="570"))], "host h1", "driver_branch"),
    ("cross", "pool images differ", [("h1", host(pool="p", recipe="qwen3-8b-vllm-1gpu")),
                                     ("h2", host(ssh_hostname="192.0.2.11", pool="p",
                                                 image="vllm/vllm-openai:v0.35.0"))], "pool p", "image"),
    ("cross", "pool ports differ", [("h1", host(pool="p")), ("h2", host(ssh_hostname="192.0.2.11", pool="p",
                                                                         port=8001))], "pool p", "port"),
    ("cross", "duplicate address", [("h1", host()), ("h2", host())], "host h2", "ssh_hostname"),
    ("cross", "bind not an address", [("h1", host(bind_address="my-host", api_key_env="K"))], "host h1",
     "bind_address"),
    ("cross", "fabric address", [("h1", host(fabric_address="10.0.0.300"))], "host h1", "fabric_address"),
    ("cross", "ssh hostname", [("h1", host(ssh_hostname="bad host"))], "host h1", "ssh_hostname"),
    ("cross", "recipe for another model", [("h1", host(recipe="tiny-lab-llamacpp"))], "host h1", "recipe"),
    ("cross", "open endpoint without key", [("h1", host(bind_address="0.0.0.0"))], "host h1", "bind_address"),
    # vLLM's key leaves /invocations open: off loopback it is refused even with a key.
    ("cross", "vllm off loopback with key", [("h1", host(bind_address="0.0.0.0", api_key_env="K"))], "host h1",
     "bind_address"),
    ("cross", "empty services", [("h1", host(model=..., engine=..., services=[]))], "host h1", "services"),
    ("cross", "service not a dict", [("h1", host(model=..., engine=..., services=["vllm"]))], "host h1",
     "services"),
    ("cross", "cuda toolkit", [("h1", host(cuda_toolkit="13.0; id"))], "host h1", "cuda_toolkit"),
    ("cross", "driver branch", [("h1", host(driver_branch="58O"))], "host h1", "driver_branch"),
    # secrets
    ("secret", "key var unset", [("h1", host(api_key_env="MODELFLEET_CORPUS_UNSET"))], "host h1", "api_key_env"),
    ("secret", "key var empty", [("h1", host(api_key_env="MODELFLEET_CORPUS_EMPTY"))], "host h1", "api_key_env"),
    ("secret", "token as key var", [("h1", host(api_key_env=FAKE_API_KEY))], "host h1",
     "api_key_env"),
    ("secret", "hf token as var", [("h1", host(hf_token_env=FAKE_HF_TOKEN))],
     "host h1", "hf_token_env"),
    ("secret", "--api-key in extra_args", [("h1", host(extra_args=["--api-key", "abc"]))], "host h1",
     "extra_args"),
    ("secret", "--host rebind", [("h1", host(extra_args=["--host", "0.0.0.0"]))], "host h1", "extra_args"),
    ("secret", "--host= rebind", [("h1", host(extra_args=["--host=0.0.0.0"]))], "host h1", "extra_args"),
    ("secret", "--port override", [("h1", host(extra_args=["--port", "9999"]))], "host h1", "extra_args"),
    ("secret", "-tp override", [("h1", host(extra_args=["-tp", "2"]))], "host h1", "extra_args"),
    ("secret", "recipe flag override", [("h1", host(extra_args=["--max-model-len", "999999"]))], "host h1",
     "extra_args"),
    ("secret", "served name override", [("h1", host(extra_args=["--served-model-name", "x"]))], "host h1",
     "extra_args"),
    ("secret", "trust_remote_code false", [("h1", host(hardware="b300", gpu_count=8, model="kimi-k3.1-pro",
                                                       recipe="kimi-k3.1-pro-vllm-b300", trust_remote_code=False,
                                                       revision="0" * 40))], "host h1", "trust_remote_code"),
    ("secret", "remote code unpinned", [("h1", host(hardware="b300", gpu_count=8, model="kimi-k3.1-pro",
                                                    recipe="kimi-k3.1-pro-vllm-b300"))], "host h1", "revision"),
    # types: no bool for a number, no string for a list
    ("type", "port True", [("h1", host(port=True))], "host h1", "port"),
    ("type", "gpus True", [("h1", host(gpus=True))], "host h1", "gpus"),
    ("type", "gpu_count True", [("h1", host(gpu_count=True))], "host h1", "gpu_count"),
    ("type", "gpu_count string", [("h1", host(gpu_count="2"))], "host h1", "gpu_count"),
    ("type", "gpu_count zero", [("h1", host(gpu_count=0))], "host h1", "gpu_count"),
    ("type", "ssh_port string", [("h1", host(ssh_port="22"))], "host h1", "ssh_port"),
    ("type", "keep revisions negative", [("h1", host(model_keep_revisions=-1))], "host h1",
     "model_keep_revisions"),
    ("type", "extra_args string", [("h1", host(extra_args="--seed 1"))], "host h1", "extra_args"),
    ("type", "reboot string", [("h1", host(reboot="no"))], "host h1", "reboot"),
    ("type", "timeout", [("h1", host(netcheck_timeout_s=1))], "host h1", "netcheck_timeout_s"),
    # references
    ("reference", "image without tag", [("h1", host(image="vllm/vllm-openai"))], "host h1", "image"),
    ("reference", "image bad digest", [("h1", host(image="vllm/vllm-openai@sha256:abc"))], "host h1", "image"),
    ("reference", "image upper case", [("h1", host(image="VLLM/vllm-openai:v1"))], "host h1", "image"),
    ("reference", "dcgm image", [("h1", host(dcgm_exporter_image="dcgm exporter"))], "host h1",
     "dcgm_exporter_image"),
    ("reference", "gpu check image", [("h1", host(gpu_check_image="ubuntu"))], "host h1", "gpu_check_image"),
]


def write_inventory(folder: Path, hosts: list, group_data: dict | None = None, tail: str = "") -> Path:
    inv = folder / "inventories" / "corpus.py"
    inv.parent.mkdir(parents=True, exist_ok=True)
    inv.write_text(f"hosts = {hosts!r}\n{tail}")
    if group_data is not None:
        (inv.parent / "group_data").mkdir(exist_ok=True)
        for name, text in group_data.items():
            (inv.parent / "group_data" / f"{name}.py").write_text(text)
    return inv


def validate(path: Path):
    return CliRunner().invoke(main, ["validate", str(path), "--json"])


@pytest.fixture(autouse=True)
def key_variables(monkeypatch):
    monkeypatch.setenv("K", "a-key")
    monkeypatch.setenv("MODELFLEET_CORPUS_EMPTY", "")
    monkeypatch.delenv("MODELFLEET_CORPUS_UNSET", raising=False)


@pytest.mark.parametrize("kind,case,hosts,where,field", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_malformed_inventory_is_refused_naming_host_and_field(tmp_path, kind, case, hosts, where, field):
    result = validate(write_inventory(tmp_path, hosts))
    assert result.exit_code == 2 and result.exception is None or isinstance(result.exception, SystemExit), \
        result.output
    report = json.loads(result.output)
    named = [(e["where"], e["field"].split(".")[0]) for e in report["errors"]]
    assert (where, field) in named, report["errors"]
    for secret in (FAKE_API_KEY, FAKE_HF_TOKEN, "a-key"):
        assert secret not in result.output  # a pasted token is never echoed


FILE_CASES = [
    ("syntax error", "hosts = [(\n", None, ":1", "syntax error"),
    ("exception", "import os\nhosts = [('h1', {})]\nraise RuntimeError('boom')\n", None, ":3", "RuntimeError"),
    ("host data not a dict", "hosts = [('h1', ['gpu_count', 1])]\n", None, "corpus.py", "must be a dict"),
    ("host not a name", "hosts = [('h1', {}), 42]\n", None, "corpus.py", "neither a name"),
    ("group_data syntax", "hosts = [('h1', {})]\n", {"all": "gpu_count = (\n"}, "all.py:1", "syntax error"),
    ("group_data exception", "hosts = [('h1', {})]\n", {"all": "x = 1\ny = 1 / 0\n"}, "all.py:2",
     "ZeroDivisionError"),
    ("listed twice", "hosts = [('h1', {}), ('h1', {})]\n", None, "corpus.py", "listed twice"),
    ("data twice", "a = [('h1', {'gpu_count': 1})]\nb = [('h1', {'gpu_count': 2})]\n", None, "corpus.py",
     "data in groups a and b"),
    ("empty", "hosts = []\n", None, "inventory", "no hosts"),
]


@pytest.mark.parametrize("case,text,group_data,where,message", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_broken_files_are_one_error_naming_file_and_line(tmp_path, case, text, group_data, where, message):
    inv = write_inventory(tmp_path, [], group_data)
    inv.write_text(text)
    result = validate(inv)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    errors = json.loads(result.output)["errors"]
    assert any(where in e["where"] and message in e["message"] for e in errors), errors


def test_site_recipes_are_validated_and_never_shadow_silently(tmp_path):
    shipped = (ROOT / "modelfleet" / "plan" / "catalog" / "recipes" / "qwen3-8b-vllm-1gpu.yaml").read_text()
    inv = write_inventory(tmp_path, [("h1", host())])
    recipes = inv.parent / "recipes"
    recipes.mkdir()
    (recipes / "mine.yaml").write_text(shipped)  # same id as the shipped one, no `overrides`
    shadow = validate(inv)
    assert shadow.exit_code == 2 and "pick a new id" in shadow.output and "mine.yaml" in shadow.output
    (recipes / "mine.yaml").write_text(shipped + "overrides: qwen3-8b-vllm-1gpu\n")
    assert validate(inv).exit_code == 0
    (recipes / "mine.yaml").write_text("id: x\nmodel: [\n")
    broken = validate(inv)
    assert broken.exit_code == 2 and "mine.yaml:" in broken.output and "YAML" in broken.output
    (recipes / "mine.yaml").write_text(shipped.replace("id: qwen3-8b-vllm-1gpu", "id: site-qwen")
                                       .replace("hardware: [rtx4090, h100, h200]", "hardware: [h200]"))
    both = validate(inv)  # two recipes now match: the inventory must name one
    assert both.exit_code == 2 and "several recipes match" in both.output


VALID = [
    ("ipv6 address", [("h1", host(ssh_hostname="2001:db8::10"))]),
    ("non-default ssh port", [("h1", host(ssh_port=2222, port=8000))]),
    ("two pools on one host", [("h1", host(model=..., engine=..., services=[svc(pool="a", port=8000, gpus=1),
                                                                           svc(pool="b", port=8001, gpus=1)]))]),
    ("digest-pinned image", [("h1", host(image=f"vllm/vllm-openai:v0.34.0@{DIGEST}"))]),
    ("registry with port", [("h1", host(image=f"registry.example.com:5000/vllm/vllm-openai@{DIGEST}"))]),
    ("hub id as served name", [("h1", host(served_name="Qwen/Qwen3-8B"))]),
    # llama-server's key covers every route that serves the model.
    ("key on an open endpoint", [("h1", host(gpu_count=8, model="kimi-k3", engine="llama.cpp",
                                             recipe="kimi-k3-llamacpp-h200", revision="a" * 40,
                                             bind_address="0.0.0.0", api_key_env="K"))]),
    ("pyinfra's own keys", [("h1", host(_sudo=True, ssh_strict_host_key_checking="accept-new"))]),
]


@pytest.mark.parametrize("case,hosts", VALID, ids=[c[0] for c in VALID])
def test_unusual_but_valid_inventories_pass(tmp_path, case, hosts):
    result = validate(write_inventory(tmp_path, hosts))
    assert result.exit_code == 0, result.output


def test_plan_refuses_nonsense_arguments():
    for argv in (["--gpus", "-1"], ["--gpus", "8", "--nodes", "0"], ["--gpus", "8", "--keep-revisions", "-2"]):
        result = CliRunner().invoke(main, ["plan", "--model", "kimi-k3", "--hardware", "b300", *argv])
        assert result.exit_code == 2 and "Invalid value" in result.output


REAL = [
    ("unknown model", {"model": "nope"}),
    ("open endpoint without key", {"bind_address": "0.0.0.0"}),
    ("too many gpus", {"gpus": 4}),
    ("newline in served name", {"served_name": "x\nExecStartPre=/bin/sh"}),
    ("typo", {"gpu_cout": 1}),
]


@pytest.mark.slow
@pytest.mark.parametrize("case,change", REAL, ids=[c[0] for c in REAL])
def test_real_pyinfra_command_refuses_before_connecting(tmp_path, case, change):
    listener = CountingListener()
    hosts = [(f"h{i}", host(ssh_hostname="127.0.0.1", ssh_port=listener.port, **change)) for i in range(4)]
    hosts = [(name, {**data, "port": 8000 + i}) for i, (name, data) in enumerate(hosts)]
    inv = write_inventory(tmp_path, hosts, tail="from modelfleet.plan.inventory import refuse_invalid as _r\n"
                                                "_r(__file__)\n")
    run = subprocess.run([sys.executable, "-m", "pyinfra", "-y", str(inv), str(ROOT / "deploys" / "serve.py")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "Traceback" not in run.stdout + run.stderr and "host h0" in run.stderr
    assert listener.count == 0
    listener.sock.close()
