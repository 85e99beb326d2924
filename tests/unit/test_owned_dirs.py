"""Owned directories: the rule for what config_dir and model_root may name (grammar.owned_directory), the lab's
own paths under it, which existing directory modelfleet may take over (operations.files.foreign_entries), and
the stages through pyinfra's @fake connector refusing someone else's directory and a non-empty mount point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyinfra.api.exceptions import PyinfraError

from modelfleet.base.grammar import owned_directory
from modelfleet.host.operations.files import MARKER, foreign_entries
from modelfleet.plan.inventory import resolve
from modelfleet.plan.inventory.schema import HostData
from modelfleet.run.pipeline import run_stages
from modelfleet.run.stages import preflight, service, storage
from tests.conftest import ROOT

REFUSED = ["/", "/var/lib", "/usr/bin", "/etc/ssh", "/var/lib/docker", "/boot/efi", "/proc/x", "/home", "/etc",
           "/usr/", "/var", "/sys/fs/cgroup", "/dev/shm", "/run/modelfleet", "/lib64/x", "/snap/x", "/srv", "/mnt",
           "/opt", "/tmp", "/root", "/media", "/home/alice", "/root/.ssh", "/home/alice/.config/models",
           "/opt/rocm-7.0", "/opt/nvidia/models", "/etc/modelfleetx", "/tmp/models", "/var/tmp/x", "/dev/shm/m",
           "/etc/modelfleet-../ssh",
           # below a home: its owner (an ordinary user) may swap what is in it for a symlink root would follow
           "/home/alice/models", "/home/alice/a/b/cache"]
ACCEPTED = ["/srv/models", "/etc/modelfleet", "/etc/modelfleet/site-a", "/var/lib/modelfleet",
            "/var/lib/modelfleet/models", "/data", "/data1/models", "/models", "/nvme0/models", "/raid0", "/scratch/m",
            "/mnt/nvme0", "/opt/modelfleet", "/root/modelfleet/models", "/tmp/ci-clone/models",
            # directories of modelfleet's own inside the system trees (issue 40)
            "/etc/modelfleet-prod", "/var/lib/modelfleet-other", "/etc/modelfleet_b/keys"]


@pytest.mark.parametrize("path", REFUSED)
def test_system_directories_are_refused_at_any_depth(path):
    reason = owned_directory(path)
    assert reason and "name a directory of its own" in reason, reason


@pytest.mark.parametrize("path", ACCEPTED)
def test_a_sites_own_directories_pass(path):
    assert owned_directory(path) is None


def test_the_message_suggests_a_directory_of_modelfleets_own():
    assert owned_directory("/var/lib") == ("/var/lib is inside the system directory /var: modelfleet would chown, "
                                           "chmod or mount over it; name a directory of its own (e.g. "
                                           "/var/lib/modelfleet)")
    assert "(e.g. /srv/models, /etc/modelfleet)" in owned_directory("/etc/ssh")


def test_the_schema_defaults_and_the_labs_paths_pass():
    defaults = HostData()
    assert owned_directory(defaults.model_root) is None and owned_directory(defaults.config_dir) is None
    # lab/__init__.py puts each lab host's directories in the lab's state folder of the checkout (wherever it
    # is cloned: CI clones into a temporary directory) and the lab e2e tests use /srv/models-* roots.
    for top in (ROOT, Path("/tmp/tmp.Ab12/modelfleet"), Path("/root/src/modelfleet")):
        for state in (".lab", ".lab-test", ".lab-test2"):
            home = top / state / "hosts" / "mflab-1"
            for path in (home / "models", home / "etc-modelfleet"):
                assert owned_directory(str(path)) is None, path
    for root in ("/srv/models-nvme", "/srv/models-e2e", "/srv/models-faults", "/srv/models-small",
                 "/srv/models-fanout"):
        assert owned_directory(root) is None


def test_validate_names_host_and_field():
    result = resolve([("gpu-3", {"hardware": "h200", "model": "qwen3-8b", "engine": "vllm",
                                 "config_dir": "/etc/ssh", "model_root": "/var/lib/docker"})])
    found = {(w, f): m for w, f, m in result.errors}
    assert "/etc/ssh is inside the system directory /etc" in found[("host gpu-3", "config_dir")]
    assert "/var/lib/docker is inside the system directory /var" in found[("host gpu-3", "model_root")]
    result = resolve([("gpu-4", {"hardware": "h200", "model": "qwen3-8b", "engine": "vllm",
                                 "model_root": "/home/alice/models"})])
    assert [(w, f) for w, f, _ in result.errors] == [("host gpu-4", "model_root")]
    assert "/home/alice/models is inside /home/alice, a directory an ordinary user owns" in result.errors[0][2]


def dir_state(*entries: str) -> dict:
    return {"kind": "dir", "mode": "755", "user": "root", "group": "root", "sha256": None, "entries": list(entries)}


def test_which_existing_directories_modelfleet_may_take_over():
    assert foreign_entries(None) == []
    assert foreign_entries(dir_state()) == []
    assert foreign_entries(dir_state(MARKER, "sshd_config")) == []  # the marker: modelfleet made it
    assert foreign_entries(dir_state(".cache", ".modelfleet-lock", "config.json")) == []  # a checkpoint being fetched
    assert foreign_entries(dir_state("hf-token", "k31.auth", "k31.env", "k31.secrets.yaml",
                                     "checkpoint-qwen3-8b-0123456789ab.json",
                                     "checkpoint-qwen3-8b-0123456789ab.json.log", ".k31.env.modelfleet-tmp")) == []
    assert foreign_entries(dir_state("modelfleet_fetch.py", "nccl_check.py")) == []  # the tools directory
    assert foreign_entries(dir_state("k31.env", "sshd_config", "ssh_host_rsa_key")) == ["sshd_config",
                                                                                       "ssh_host_rsa_key"]
    assert foreign_entries(dir_state(".env")) == [".env"]  # a project's dotenv, not a pool's env file
    assert foreign_entries(dir_state("lost+found", "data"), claimed=True) == []


def test_storage_refuses_to_mount_over_a_directory_that_holds_files():
    plan = resolve([("gpu-1", {"hardware": "h200", "model": "qwen3-8b", "engine": "vllm",
                               "nvme_devices": ["/dev/nvme0n1"]})]).hosts["gpu-1"]
    assert storage.mount_point_problem(plan, None, None) is None  # absent: mkdir -p makes it
    assert storage.mount_point_problem(plan, dir_state(), None) is None
    assert storage.mount_point_problem(plan, dir_state(MARKER), None) is None
    assert storage.mount_point_problem(plan, dir_state("a", "b"), "/srv/models") is None  # ours, mounted there
    assert storage.mount_point_problem(plan, dir_state("qwen3-8b", "notes.txt", "x", "y"), None) == (
        "storage: model_root /srv/models holds files (qwen3-8b, notes.txt, x, ...); refusing to mount a "
        "filesystem over them (they would be hidden). Move them away or name another model_root")


def h200_probe(fake, block_devices: list[str] | None = None) -> list[str]:
    return fake.probe_reply({
        "nvidia_gpus": fake.recorded(fake.H200 / "nvidia-smi-query-gpu-header.txt"),
        "nvidia_versions": fake.recorded(fake.H200 / "nvidia-smi-version.txt"),
        "nvidia_module": fake.recorded(fake.H200 / "proc-driver-version.txt"),
        "topology": fake.recorded(fake.H200 / "nvidia-smi-topo.txt"),
        "amd_gpus": None,
        "block_devices": block_devices or fake.recorded(fake.H200 / "lsblk-json.txt"),
        "os": fake.recorded(fake.H200 / "os-release.txt"),
        "ports": [], "runtime": ["docker=none", "server=none", "runtimes=", "nvidia_ctk=none"],
        "disk": ["Filesystem 1-blocks Used Available Capacity Mounted on",
                 "/dev/vda 270553174016 17286574080 68702363648 21% /"],
    })


H200_HOST = {"hardware": "h200", "gpu_count": 1, "model": "qwen3-8b", "engine": "vllm", "revision": "f" * 40,
             "pool": "q", "image": "vllm/vllm-openai:v0.34.0@sha256:" + "f" * 64}


def test_service_stage_refuses_someone_elses_config_dir_and_writes_nothing_into_it(fake, caplog):
    state_lines = ["@@modelfleet-state path /srv/app", "dir 700 root root -", "entries", "entry app.conf",
                   "entry q.env", "entry secrets"]
    host = {**H200_HOST, "config_dir": "/srv/app",
            "fake_responses": {"@@modelfleet-probe": h200_probe(fake), "@@modelfleet-state": state_lines}}
    state = fake.run_fake([("h200", host)], lambda: run_stages(preflight, service), dry=True)
    with pytest.raises(PyinfraError, match="No hosts remaining"):
        fake.finish(state)
    commands = fake.executed(state, "h200")
    assert not any("/srv/app" in c and ("chmod" in c or "chown" in c) for c in commands), commands
    assert not any(c.startswith("systemctl") for c in commands)  # the host stopped at the directory
    assert "[@fake/h200] refused: /srv/app is not empty (app.conf, secrets) and modelfleet did not make it" \
        in caplog.text


def test_service_stage_creates_a_fresh_config_dir_with_the_marker(fake):
    host = {**H200_HOST, "config_dir": "/srv/mf-etc", "fake_responses": {"@@modelfleet-probe": h200_probe(fake)}}
    commands = fake.executed(fake.run_fake([("h200", host)], lambda: run_stages(preflight, service)), "h200")
    assert ("mkdir -p /srv/mf-etc && chown root:root /srv/mf-etc && chmod 0700 /srv/mf-etc && "
            "{ [ -L /srv/mf-etc/.modelfleet-owned ] || [ -e /srv/mf-etc/.modelfleet-owned ] || "
            "( set -C; : > /srv/mf-etc/.modelfleet-owned ); }") in commands


def test_storage_stage_refuses_a_mount_point_that_holds_files(fake, caplog):
    devices = json.dumps({"blockdevices": [{
        "name": "nvme0n1", "path": "/dev/nvme0n1", "size": 7681501126656, "type": "disk", "mountpoint": None,
        "fstype": None, "pttype": None, "label": None, "uuid": None, "model": "SAMSUNG MZWLO7T6HBLA-00A07",
        "tran": "nvme", "rota": False, "serial": "S6EYNA0W00000"}]}, indent=3).splitlines()
    state_lines = ["@@modelfleet-state path /srv/models", "dir 755 root root -", "entries", "entry old-models"]
    host = {**H200_HOST, "nvme_devices": ["/dev/nvme0n1"],
            "fake_responses": {"@@modelfleet-probe": h200_probe(fake, devices), "@@modelfleet-state": state_lines}}
    state = fake.run_fake([("h200", host)], lambda: run_stages(preflight, storage), dry=True)
    with pytest.raises(PyinfraError, match="No hosts remaining"):
        fake.finish(state)
    changes = [c for c in fake.executed(state, "h200") if "@@modelfleet-" not in c]  # but the reads of the host
    assert not any(c.startswith(("mkfs", "mdadm", "sh -c")) for c in changes), changes
    assert "refused: storage: model_root /srv/models holds files (old-models)" in caplog.text


def test_the_marker_is_never_made_through_a_link_planted_in_the_directory(tmp_path):
    """An engine container that can write its cache directory chmods it (so the next run fixes its mode) and
    plants `.modelfleet-owned -> /etc/nologin`: `touch` as root made the victim, an empty file anywhere."""
    import subprocess

    from modelfleet.host.operations.files import directory

    cache = tmp_path / "cache" / "0123456789abcdef"
    cache.mkdir(parents=True)
    cache.chmod(0o777)
    victim = tmp_path / "etc" / "nologin"
    victim.parent.mkdir()
    (cache / MARKER).symlink_to(victim)
    current = {"kind": "dir", "mode": "777", "user": "root", "group": "root", "entries": [MARKER]}
    commands = [str(c.get_raw_value()) for c in directory._inner(path=str(cache), current=current)
                if hasattr(c, "get_raw_value")]
    assert len(commands) == 1
    run = subprocess.run(["sh", "-c", commands[0]], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert not victim.exists() and (cache / MARKER).is_symlink()  # nothing made through the link
    assert oct(cache.stat().st_mode & 0o777) == "0o755"
    fresh = tmp_path / "fresh"
    commands = [str(c.get_raw_value()) for c in directory._inner(path=str(fresh), current=None)
                if hasattr(c, "get_raw_value")]
    assert subprocess.run(["sh", "-c", commands[0]]).returncode == 0 and (fresh / MARKER).is_file()


def test_every_file_modelfleet_writes_into_the_config_dir_is_a_name_it_knows(monkeypatch):
    """What the stages write beside the env files (a rank's restart count, Ollama's Modelfile, a front door's
    and a replica door's files, the jobs of the fan-out) keeps the directory modelfleet's on the next run."""
    import fnmatch
    import posixpath
    from types import SimpleNamespace

    from modelfleet.host import transfer, units
    from modelfleet.host.operations.files import OWN_NAMES
    from modelfleet.plan import render, replica_door, router, weight_cache
    from modelfleet.run.stages import engine_cache, model
    from tests.helpers.front_doors import KEY, fleet

    monkeypatch.setenv("MF_ROUTER_KEY", KEY)
    result = resolve(fleet("sglang"))
    rp, plan = result.routers["tiny-lab"], result.hosts["a"]
    svc = plan.services[0]
    written = [units.flap_file(plan, svc.pool), render.modelfile_path(svc), weight_cache.env_file(svc),
               svc.env_file, svc.auth_file, svc.secrets_config_file, transfer.serve_job_path(plan.config_dir, "g"),
               model._job_path(plan, f"{plan.model_root}/tiny-lab/{'a' * 40}"), f"{plan.config_dir}/hf-token",
               *[p for p in replica_door.paths(svc).values() if p.startswith(plan.config_dir)],
               *[p for p in router.paths(rp).values() if p.startswith(rp.config_dir + "/")]]
    written.append(engine_cache._job_path(plan, SimpleNamespace(key="0123456789abcdef")))
    unknown = [p for p in written if not any(fnmatch.fnmatchcase(posixpath.basename(p), pattern)
                                             for pattern in OWN_NAMES)]
    assert unknown == []


def test_a_directory_taken_over_as_it_was_is_marked(fake):
    """A config directory someone made empty with modelfleet's owner and mode gets the marker on the first run."""
    from modelfleet.host.operations.files import directory

    def deploy():
        directory(name="d", path="/srv/app", current=dir_state())
        directory(name="marked", path="/srv/other", current=dir_state(MARKER, "q.env"))

    state = fake.run_fake([("h", {})], deploy)
    commands = fake.executed(state, "h")
    assert any(f"/srv/app/{MARKER}" in c and "set -C" in c for c in commands), commands
    assert not any("/srv/other" in c for c in commands)
