import subprocess
import sys

import pytest

from modelfleet.plan import render
from modelfleet.plan.inventory import resolve
from tests.helpers.made_keys import made_key

PIN = "b" * 40


def service(**extra):
    data = {"hardware": "b300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": PIN, "pool": "k31",
            "served_name": "kimi-local", **extra}
    result = resolve([("b300-01", data)])
    assert result.errors == []
    return result.hosts["b300-01"].services[0]


def test_vllm_command_is_the_guides():
    argv = " ".join(render.docker_run_argv(service()))
    assert ("--entrypoint vllm vllm/vllm-openai:v0.34.0 serve /model --served-model-name kimi-local "
            "moonshotai/Kimi-K3.1-Pro --host 127.0.0.1 --port 8000 --gpu-memory-utilization 0.9 --trust-remote-code "
            "--tensor-parallel-size 8 --load-format "
            "fastsafetensors --enable-auto-tool-choice --tool-call-parser kimi_k3 --reasoning-parser kimi_k3 "
            "--max-model-len 32768") in argv
    assert "--rm --name modelfleet-k31-b300-01 --init" in argv
    assert "--gpus" not in argv and "--ipc=host" in argv
    assert " ".join(f"--device nvidia.com/gpu={i}" for i in range(8)) in argv  # its own 8 GPUs, through CDI
    assert f"-v /srv/models/kimi-k3.1-pro/{PIN}:/model:ro" in argv


def test_unit_has_limits_timeouts_and_stop():
    unit = render.render_unit(service())
    assert "StartLimitBurst=3" in unit and "StartLimitIntervalSec=600" in unit
    assert "Restart=on-failure" in unit
    assert "TimeoutStartSec=3900" in unit  # > VLLM_ENGINE_READY_TIMEOUT_S=3600
    assert "ExecStop=/usr/bin/docker stop --time 30 modelfleet-k31-b300-01" in unit


def test_secret_goes_to_the_env_file_only(monkeypatch):
    key = made_key()
    monkeypatch.setenv("K31_KEY", key)
    svc = service(api_key_env="K31_KEY")
    assert key not in render.render_unit(svc)
    assert key not in " ".join(render.docker_run_argv(svc))
    assert f"VLLM_API_KEY={key}" in render.render_env(svc)
    masked = render.render_env(svc, mask=True)
    assert key not in masked and "VLLM_API_KEY=********" in masked


def test_sglang_key_goes_to_a_config_file(monkeypatch):
    key = made_key()
    monkeypatch.setenv("SGL_KEY", key)
    data = {"hardware": "b300", "model": "kimi-k3.1-pro", "engine": "sglang", "revision": PIN, "pool": "s",
            "api_key_env": "SGL_KEY"}
    svc = resolve([("h", data)]).hosts["h"].services[0]
    argv = render.docker_run_argv(svc)
    assert key not in " ".join(argv)
    assert "--config" in argv and "--shm-size" in argv
    assert key in render.render_secrets_config(svc)


def test_systemd_quoting_keeps_json_in_one_argument():
    assert render.systemd_quote('{"a":true}') == "'{\"a\":true}'"
    assert render.systemd_quote("50%") == "50%%"
    assert render.systemd_quote("--port") == "--port"


@pytest.mark.slow
def test_render_cli_masks_and_names_files(monkeypatch):
    out = subprocess.run([sys.executable, "-m", "modelfleet.cli", "render", "inventories/prod.py", "b300-01"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "# ==> /etc/systemd/system/modelfleet-kimi-k31-b300.service" in out.stdout
    assert "VLLM_ENGINE_READY_TIMEOUT_S=3600" in out.stdout


@pytest.mark.slow
def test_plan_cli_refuses_and_accepts():
    refuse = subprocess.run([sys.executable, "-m", "modelfleet.cli", "plan", "--model", "kimi-k3.1-pro",
                             "--hardware", "rtx4090", "--gpus", "1"], capture_output=True, text=True)
    assert refuse.returncode == 1 and "needs 1.49 TB" in refuse.stdout
    accept = subprocess.run([sys.executable, "-m", "modelfleet.cli", "plan", "--model", "kimi-k3.1-pro",
                             "--hardware", "b300", "--gpus", "8", "--json"], capture_output=True, text=True)
    assert accept.returncode == 0 and '"fits": true' in accept.stdout


def _pool(data, hosts=("t1", "t2")):
    resolved = resolve([(h, {**data, "ssh_hostname": f"10.0.0.{i + 1}"}) for i, h in enumerate(hosts)])
    assert not resolved.errors, resolved.errors
    return [resolved.hosts[h].services[0] for h in hosts]


def test_vllm_tp_across_two_trays_gets_nnodes_and_a_headless_worker():
    head, worker = _pool({"hardware": "gb300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": "e" * 40,
                          "pool": "k31"})
    h, w = " ".join(render.engine_argv(head)), " ".join(render.engine_argv(worker))
    assert "--nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500" in h and "--headless" not in h
    assert "--nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --master-port 29500 --headless" in w


def test_vllm_data_parallel_pool_gets_start_ranks():
    head, worker = _pool({"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm",
                          "recipe": "tiny-lab-vllm-dp2", "pool": "dp"})
    h, w = " ".join(render.engine_argv(head)), " ".join(render.engine_argv(worker))
    common = "--data-parallel-size 2 --data-parallel-size-local 1 --data-parallel-address 10.0.0.1"
    assert common in h and "--headless" not in h
    assert common in w and "--headless --data-parallel-start-rank 1" in w


def test_llama_cpp_cannot_span_nodes():
    data = {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "llama.cpp", "recipe": "tiny-lab-vllm-dp2",
            "pool": "dp"}
    resolved = resolve([("t1", data), ("t2", data)])
    assert any(field == "engine" or field == "recipe" for _, field, _ in resolved.errors), resolved.errors
