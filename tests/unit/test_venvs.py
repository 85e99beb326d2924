"""runtime: venv (modelfleet.plan.venvs, docs/venv.md): the lock and wheelhouse held to what pip --require-hashes
installs, refused by host and field before any host is touched; the unit runs the venv's engine with the
container's argv, environment, GPUs and restart rules; the host-side build and prune run for real here."""

import base64
import hashlib
import io
import os
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from modelfleet.host import units
from modelfleet.host.facts.host import Pythons
from modelfleet.plan import render, venvs
from modelfleet.plan.inventory import resolve
from modelfleet.run.stages import engine_cache, images, preflight
from tests.helpers.made_keys import made_key

PIN = "b" * 40
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "venv"
LOCK = str(FIXTURES / "kimi-k31-vllm.lock")


def _h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def b300(**extra):
    return {"hardware": "b300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": PIN, "pool": "k31",
            "served_name": "kimi-local", "runtime": "venv", "venv_lock": LOCK, **extra}


def _service(**extra):
    result = resolve([("b300-01", b300(**extra))])
    assert result.errors == [], result.errors
    return result.hosts["b300-01"].services[0]


def _errors(**extra) -> list[tuple[str, str, str]]:
    return resolve([("b300-01", b300(**extra))]).errors


def _lock(tmp_path, text: str, name: str = "site.lock") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


FULL = "".join(f"{n}=={v} --hash=sha256:{_h(n + v)}\n" for n, v in
               [("vllm", "0.34.0"), ("fastsafetensors", "0.1.15"), ("torch", "2.11.0")])


# --- the lock, the wheelhouse and the interpreter: refused by host and field, before any host is touched ---

def test_a_lock_entry_without_a_hash_is_refused_naming_host_field_file_and_line(tmp_path):
    lock = _lock(tmp_path, FULL + "numpy==2.3.4\n")
    errors = _errors(venv_lock=lock)
    assert [(w, f) for w, f, _ in errors] == [("host b300-01", "venv_lock")]
    assert f"{lock} line 4: numpy==2.3.4 has no --hash=sha256" in errors[0][2]


@pytest.mark.parametrize("line, said", [
    ("numpy>=2 --hash=sha256:" + "0" * 64, "numpy is not pinned to one version"),
    ("--index-url https://pypi.example/simple", "--index-url is an option, not a requirement"),
    ("numpy @ https://example.com/numpy.whl --hash=sha256:" + "0" * 64, "numpy is not pinned"),
])
def test_a_lock_holds_only_pinned_hashed_requirements(tmp_path, line, said):
    errors = _errors(venv_lock=_lock(tmp_path, FULL + line + "\n"))
    assert [f for _, f, _ in errors] == ["venv_lock"] and said in errors[0][2]


def test_the_lock_must_hold_what_the_guide_installs(tmp_path):
    without = "".join(line + "\n" for line in FULL.splitlines() if not line.startswith("fastsafetensors"))
    errors = _errors(venv_lock=_lock(tmp_path, without))
    assert [f for _, f, _ in errors] == ["venv_lock"]
    assert "needs fastsafetensors (the guide installs it)" in errors[0][2]
    old = FULL.replace("vllm==0.34.0 --hash=sha256:" + _h("vllm0.34.0"), "vllm==0.33.1 --hash=sha256:" + "1" * 64)
    errors = _errors(venv_lock=_lock(tmp_path, old, "old.lock"))
    assert "needs vllm>=0.34.0" in errors[0][2] and "pins vllm==0.33.1" in errors[0][2]


def test_no_lock_is_refused_with_the_recipes_way_to_make_one():
    errors = _errors(venv_lock=None)
    assert [f for _, f, _ in errors] == ["venv_lock"]
    assert "uv pip compile --generate-hashes" in errors[0][2]


def test_a_recipe_without_a_venv_route_and_settings_that_need_the_other_runtime_are_refused(tmp_path):
    qwen = {"hardware": "h200", "model": "qwen3-8b", "engine": "vllm", "runtime": "venv", "venv_lock": LOCK}
    errors = resolve([("h", qwen)]).errors
    assert [(w, f) for w, f, _ in errors] == [("host h", "runtime")] and "has no venv route" in errors[0][2]
    assert [f for _, f, _ in _errors(weight_cache=True)] == ["weight_cache"]
    assert [f for _, f, _ in _errors(image="vllm/vllm-openai:v0.34.0")] == ["image"]
    container = resolve([("b300-01", b300(runtime="container"))]).errors
    assert [f for _, f, _ in container] == ["venv_lock"] and "runs a container" in container[0][2]


def _wheel(directory: Path, name: str, version: str, tag: str = "py3-none-any", module: str | None = None) -> Path:
    """A real, installable wheel (a module printing its name), as pip builds them."""
    dist = f"{name.replace('-', '_')}-{version}"
    files = {f"{module or name.replace('-', '_')}.py": f"NAME = {name!r}\n",
             f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}.dist-info/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n"}
    record = "".join(f"{p},sha256="
                     f"{base64.urlsafe_b64encode(hashlib.sha256(c.encode()).digest()).rstrip(b'=').decode()},"
                     f"{len(c)}\n" for p, c in files.items()) + f"{dist}.dist-info/RECORD,,\n"
    files[f"{dist}.dist-info/RECORD"] = record
    path = directory / f"{dist}-{tag}.whl"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for p, c in files.items():
            zf.writestr(p, c)
    path.write_bytes(buffer.getvalue())
    return path


def _locked(paths: list[Path], versions: dict[str, str]) -> str:
    return "".join(f"{name}=={versions[name]} \\\n    --hash=sha256:{hashlib.sha256(p.read_bytes()).hexdigest()}\n"
                   for name, p in zip(versions, paths, strict=True))


def test_a_wheelhouse_missing_a_file_the_lock_names_is_refused(tmp_path):
    house = tmp_path / "wheels"
    house.mkdir()
    paths = [_wheel(house, "vllm", "0.34.0", "cp311-cp311-manylinux_2_28_x86_64"),
             _wheel(house, "fastsafetensors", "0.1.15", "cp311-cp311-manylinux_2_28_x86_64")]
    lock = _lock(tmp_path, _locked(paths, {"vllm": "0.34.0", "fastsafetensors": "0.1.15"})
                 + f"torch==2.11.0 --hash=sha256:{'2' * 64}\n")
    errors = _errors(venv_lock=lock, venv_wheelhouse=str(house))
    assert [(w, f) for w, f, _ in errors] == [("host b300-01", "venv_wheelhouse")]
    assert f"{house} has no wheel or sdist of torch==2.11.0 ({lock} line 5)" in errors[0][2]


def test_the_wheels_python_against_the_named_interpreter_statically_and_on_the_host_at_run_time(tmp_path):
    house = tmp_path / "wheels"
    house.mkdir()
    versions = {"vllm": "0.34.0", "fastsafetensors": "0.1.15"}
    paths = [_wheel(house, n, v, "cp311-cp311-manylinux_2_28_x86_64") for n, v in versions.items()]
    lock = _lock(tmp_path, _locked(paths, versions))
    errors = _errors(venv_lock=lock, venv_wheelhouse=str(house), venv_python="python3.12")
    assert [f for _, f, _ in errors] == ["venv_python"] and "built for Python 3.11" in errors[0][2]
    # `python3` says no version: known only on the host, where preflight reads it and refuses the host.
    svc = _service(venv_lock=lock, venv_wheelhouse=str(house))
    assert svc.venv.python_needs == ("3.11",) and sorted(svc.venv.wheels) == sorted(p.name for p in paths)
    plan = resolve([("b300-01", b300(venv_lock=lock, venv_wheelhouse=str(house)))]).hosts["b300-01"]
    for found, said in [(None, "python3 is not on the host"),
                        ({"version": "3.12.3", "venv": True}, "python3 is Python 3.12.3; the wheelhouse's wheels "
                                                              "are built for 3.11"),
                        ({"version": "3.11.2", "venv": False}, "apt install python3.11-venv")]:
        report = preflight.evaluate(plan, {"pythons": {"python3": found} if found else {}})
        assert any(p.startswith("k31: venv_python: ") and said in p for p in report["problems"]), report["problems"]
    fine = preflight.evaluate(plan, {"pythons": {"python3": {"version": "3.11.2", "venv": True}}})
    assert not any("venv_python" in p for p in fine["problems"])


def test_render_says_where_the_venv_comes_from_and_what_only_the_host_can_tell():
    notes = render.venv_notes(_service())
    assert notes[0] == ('venv route: Kimi K3.1 Pro deployment guide, vLLM: python3 -m venv kimi-env; pip install '
                        '"vllm>=0.34.0" fastsafetensors')
    assert "the host's own pip index settings" in notes[1] and "kept for rollback" in notes[1]
    assert "read on the host by preflight" in notes[2]


def test_the_probe_reads_each_interpreter_and_its_venv_module():
    command = Pythons().command(("python3", "/opt/py/bin/python3.12"))
    assert "python3 -c 'import venv, ensurepip'" in command and "/opt/py/bin/python3.12 -c" in command
    assert Pythons().process(["python3 3.11.2 venv", "python3.12", "python3.10 3.10.12"]) == {
        "python3": {"version": "3.11.2", "venv": True}, "python3.12": {"version": None, "venv": False},
        "python3.10": {"version": "3.10.12", "venv": False}}


# --- the unit: the container's contract, from the venv ---

def test_the_venv_is_named_after_engine_version_and_lock_and_another_lock_is_another_unit(tmp_path):
    svc = _service(gpu_indices=list(range(8)))
    digest = hashlib.sha256(Path(LOCK).read_bytes()).hexdigest()
    assert svc.venv.path == f"/opt/modelfleet/venvs/vllm-0.34.0-{digest[:12]}"
    other = _service(gpu_indices=list(range(8)), venv_lock=_lock(tmp_path, Path(LOCK).read_text() + "# rebuilt\n"))
    assert other.venv.path != svc.venv.path
    assert render.render_unit(other) != render.render_unit(svc)  # drift, upgrade and rollback see a unit change


def test_the_unit_runs_the_containers_argv_from_the_venv_as_its_own_user_on_its_own_gpus():
    svc = replace(_service(), gpus=2, gpu_indices=(2, 3))
    container = replace(svc, venv=None, image="vllm/vllm-openai:v0.34.0")
    docker = render.docker_run_argv(container)
    in_container = docker[docker.index(container.image) + 1:]
    argv = render.venv_argv(svc)
    assert argv[0] == f"{svc.venv.path}/bin/vllm"
    # The same engine command line, the checkpoint by its host path instead of the container's mount.
    assert argv[1:] == [svc.model_dir if a == "/model" else a for a in in_container]
    unit = render.render_unit(svc)
    assert "User=modelfleet-engine" in unit and "docker" not in unit
    for line in ("NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes", "RemoveIPC=yes",
                 "DevicePolicy=closed", "DeviceAllow=/dev/nvidia2 rw", "DeviceAllow=/dev/nvidia3 rw",
                 f"EnvironmentFile={svc.env_file}", f"BindReadOnlyPaths={svc.model_dir}",
                 f"BindPaths={render.engine_cache(svc).dir}", "Restart=on-failure", "StartLimitBurst=3",
                 "TimeoutStartSec=3900", "TimeoutStopSec=60"):
        assert line + "\n" in unit, line
    assert "/dev/nvidia0" not in unit and "/dev/nvidia4" not in unit
    env = render.env_values(svc)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    cache = render.engine_cache(svc)
    assert env["VLLM_CACHE_ROOT"] == f"{cache.dir}/vllm"  # the host's cache directory, not the container's /cache
    assert render.env_values(container)["VLLM_CACHE_ROOT"] == "/cache/vllm"
    assert cache.key != render.engine_cache(container).key  # another build of the engine: its own compiled code
    # Its own user writes the cache: both stages that make the directory give it that owner (no flip-flop).
    assert cache.owner == venvs.ENGINE_USER and render.engine_cache(container).owner == "root"
    # Same files, same places: the env file and unit are where status, drift and retire look for them.
    assert units.unit_paths(svc) == units.unit_paths(container)


def test_sglangs_key_file_reaches_the_venv_engine_as_a_credential(monkeypatch, tmp_path):
    key = made_key()
    monkeypatch.setenv("SGL_KEY", key)
    lock = _lock(tmp_path, f"sglang==0.5.23rc1 --hash=sha256:{'3' * 64}\n")
    data = {"hardware": "b300", "model": "kimi-k3", "engine": "sglang", "revision": PIN, "pool": "s",
            "api_key_env": "SGL_KEY", "runtime": "venv", "venv_lock": lock,
            "recipe_params": {"mamba_full_memory_ratio": 0.5}, "recipe": "kimi-k3-sglang-b300"}
    result = resolve([("h", data)])
    assert result.errors == [], result.errors  # a pre-release: the guide installs with --prerelease=allow
    svc = result.hosts["h"].services[0]
    unit = render.render_unit(svc)
    assert f"LoadCredential=secrets.yaml:{svc.secrets_config_file}\n" in unit
    assert "--config %d/secrets.yaml" in unit and key not in unit
    assert svc.venv.argv0 == [f"{svc.venv.path}/bin/sglang"]


def test_the_images_stage_reads_the_venvs_not_an_image():
    plan = resolve([("b300-01", b300())]).hosts["b300-01"]
    wants = images.wants(plan, {})
    assert wants["images"] == [] and plan.services[0].venv.marker in wants["paths"]
    assert venvs.VENV_ROOT in wants["paths"] and wants["texts"] == [venvs.USER_LINE]
    # The engine cache stage runs first and makes the cache directory the engine's user owns: it reads the users.
    assert engine_cache.wants(plan, {})["texts"] == [venvs.USER_LINE]


# --- the host side, run here for real ---

@pytest.mark.slow  # a real venv with pip in it: about 15 s on 2 busy cores
def test_the_build_installs_the_lock_from_the_wheelhouse_and_refuses_a_file_whose_hash_differs(tmp_path):
    house = tmp_path / "house"
    house.mkdir()
    versions = {"engine-pkg": "1.0.0", "helper": "2.0.0"}
    paths = [_wheel(house, n, v) for n, v in versions.items()]
    lock = _locked(paths, versions)
    venv = venvs.VenvPlan(path=str(tmp_path / "venvs" / "vllm-1.0.0-abc"), engine="vllm", version="1.0.0",
                          lock_file="x", lock_digest="abc", python=sys.executable, wheelhouse=str(house),
                          wheels=tuple(p.name for p in paths), entrypoint=("vllm",))
    staging = tmp_path / "staging"

    def stage_and_build(lock_text: str):
        staging.mkdir(exist_ok=True)
        (staging / "requirements.txt").write_text(lock_text)
        for p in paths:
            (staging / p.name).write_bytes(p.read_bytes())
        command = venvs.build_command(venv).replace(venv.staging, str(staging))
        return subprocess.run(["bash", "-c", command], capture_output=True, text=True)

    (tmp_path / "venvs").mkdir()
    built = stage_and_build(lock)
    assert built.returncode == 0, built.stderr
    python = Path(venv.path) / "bin" / "python"
    out = subprocess.run([str(python), "-c", "import engine_pkg, helper; print(engine_pkg.NAME, helper.NAME)"],
                         capture_output=True, text=True)
    assert out.stdout.strip() == "engine-pkg helper"
    assert Path(venv.marker).exists() and (Path(venv.path) / venvs.LOCK_COPY).read_text() == lock
    assert not staging.exists()  # the wheelhouse's copy goes once the venv is built
    # A wheel that is not the one the lock hashed: pip refuses it, and no finished venv is left.
    tampered = lock.replace(hashlib.sha256(paths[1].read_bytes()).hexdigest(), "f" * 64)
    failed = stage_and_build(tampered)
    assert failed.returncode != 0 and "DO NOT MATCH THE HASHES" in failed.stdout + failed.stderr
    assert not Path(venv.marker).exists()


def test_prune_keeps_the_venvs_in_use_and_the_newest_other_and_follows_no_link(tmp_path):
    root = tmp_path / "venvs"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep-me").write_text("x")
    for i, name in enumerate(["vllm-0.32.0-aaa", "vllm-0.33.0-bbb", "vllm-0.34.0-ccc", "sglang-0.5.1-ddd"]):
        (root / name).mkdir(parents=True)
        (root / name / venvs.COMPLETE).touch()
        os.utime(root / name / venvs.COMPLETE, (1000 + i, 1000 + i))
    (root / "vllm-0.35.0-eee").mkdir()  # a build that never finished
    (root / "vllm-9.9.9-fff").symlink_to(outside)
    entries = sorted(p.name for p in root.iterdir())
    in_use = {"vllm-0.34.0-ccc", "sglang-0.5.1-ddd"}
    assert venvs.prune_wanted(entries, in_use)
    done = subprocess.run(["bash", "-c", venvs.prune_command(in_use, str(root))], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    left = sorted(p.name for p in root.iterdir())
    assert left == ["sglang-0.5.1-ddd", "vllm-0.33.0-bbb", "vllm-0.34.0-ccc", "vllm-9.9.9-fff"]
    assert (outside / "keep-me").exists()
    assert not venvs.prune_wanted(["vllm-0.33.0-bbb", "vllm-0.34.0-ccc"], {"vllm-0.34.0-ccc"})


def test_retire_reads_a_venv_units_files_checkpoint_and_venv_from_its_file():
    from modelfleet.run import retire

    svc = _service()
    found = retire.described(svc.unit_name, {"text": render.render_unit(svc), "ActiveState": "active"})
    assert found.venv == svc.venv.path and found.checkpoint == svc.model_dir and found.container is None
    assert svc.env_file in found.files
    plan = resolve([("b300-01", b300())]).hosts["b300-01"]
    # The plan still runs that venv under another unit: the venv is kept, the unit's own files go.
    owned = {"modelfleet-old.service": {"text": render.render_unit(svc)}}
    [kept] = retire.to_retire(owned, retire.named_units(plan), retire.kept_paths(plan))
    assert kept.venv is None


def test_retiring_removes_the_venv_and_its_engines_rollback_copies_unless_another_service_runs_that_engine(tmp_path):
    root = tmp_path / "venvs"
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ["vllm-0.33.0-aaa", "vllm-0.34.0-bbb", "sglang-0.5.1-ccc"]:
        (root / name / "bin").mkdir(parents=True)
    (root / "vllm-9-evil").symlink_to(outside)

    def run(path, kept):
        command = venvs.retire_command(path, kept).replace(venvs.VENV_ROOT, str(root))
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return sorted(p.name for p in root.iterdir())

    assert run(f"{venvs.VENV_ROOT}/vllm-0.34.0-bbb", {"vllm-0.33.0-aaa"}) == [
        "sglang-0.5.1-ccc", "vllm-0.33.0-aaa", "vllm-9-evil"]
    assert run(f"{venvs.VENV_ROOT}/vllm-0.33.0-aaa", {"sglang-0.5.1-ccc"}) == ["sglang-0.5.1-ccc", "vllm-9-evil"]
    assert outside.exists()
