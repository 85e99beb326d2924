"""TokenSpeed and Ollama on the machine's real dockerd, as their units run them: the rendered `docker run` line
(the engine double standing in for each engine, no GPU: neither runs here) and, for Ollama, the rendered
registration steps, `docker exec ... ollama create` from the Modelfile on the mounted file included; then
modelfleet's own readiness check and a chat. The doubles are held to the real parsers and Ollama's documented
API by tests/unit/test_tokenspeed_parser.py and test_ollama_double.py."""

from __future__ import annotations

import json
import shlex
import subprocess
import urllib.request
from pathlib import Path

import pytest

import lab
from modelfleet.host import units
from modelfleet.plan import render
from modelfleet.plan.inventory import resolve
from modelfleet.run.checks import endpoint
from modelfleet.run.checks.ready import readiness
from tests.helpers.listener import free_port
from tests.helpers.recipe_pools import PIN
from tests.lab.conftest import dockerd_answers

pytestmark = pytest.mark.lab

IMAGE = f"modelfleet-lab/engine-double:engines-test{lab.NET}"


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    """The lab's double image with this checkout's double and flag list (its entry points: tokenspeed, ollama)."""
    if not dockerd_answers():
        pytest.skip("needs a running dockerd")
    root = Path(__file__).resolve().parents[2]
    context = tmp_path_factory.mktemp("double")
    (context / "engine_double.py").write_text((root / "lab" / "engine_double" / "engine_double.py").read_text())
    (context / "flags.json").write_text((root / "modelfleet" / "plan" / "catalog" / "engine_flags.json").read_text())
    (context / "Dockerfile").write_text(
        f"FROM {lab.DOUBLE_IMAGE}\nCOPY engine_double.py flags.json /opt/engine-double/\n"
        "RUN chmod 755 /opt/engine-double/engine_double.py"
        " && ln -sf /opt/engine-double/engine_double.py /usr/local/bin/tokenspeed"
        " && ln -sf /opt/engine-double/engine_double.py /usr/bin/ollama\n")
    subprocess.run(["docker", "build", "-q", "-t", IMAGE, str(context)], check=True, capture_output=True)
    yield IMAGE
    subprocess.run(["docker", "rmi", "-f", IMAGE], capture_output=True)


def service(tmp_path, **data):
    name = f"{lab.PREFIX}engines"
    result = resolve([(name, {"ssh_hostname": "127.0.0.1", "revision": PIN, "gpu_passthrough": False,
                              "model_root": str(tmp_path / "models"), "config_dir": str(tmp_path / "etc"),
                              "port": free_port(), **data})])
    assert result.errors == [], result.errors
    plan = result.hosts[name]
    svc = plan.services[0]
    for path, content, _, _ in units.unit_files(svc):  # what the service stage writes beside the unit
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(content)
    Path(svc.model_dir).mkdir(parents=True)
    return plan, svc


def run_container(svc, image: str) -> None:
    argv = render.docker_run_argv(svc)
    argv[argv.index(svc.image)] = image
    subprocess.run(["docker", "rm", "-f", svc.container_name], capture_output=True)
    subprocess.run([argv[0], "run", "-d", *argv[2:]], check=True, capture_output=True)


def chat(svc, model: str) -> dict:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Say hi."}]}).encode()
    request = urllib.request.Request(f"{svc.base_url}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(request, timeout=10))


def test_ollama_unit_registers_the_mounted_file_and_serves_it(image, tmp_path):
    plan, svc = service(tmp_path, hardware="lab-cpu", model="tiny-lab", engine="ollama", recipe="tiny-lab-ollama")
    (Path(svc.model_dir) / "tiny-lab.gguf").write_bytes(b"GGUF" + bytes(range(256)) * 64)
    Path(render.store_dir(svc)).mkdir(parents=True)
    try:
        run_container(svc, image)
        for step in render.registration_steps(svc):  # the unit's ExecStartPost lines, in order, on this machine
            argv = shlex.split(step.replace("\\\n", " ").replace("$$", "$"))
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, (argv, done.stdout, done.stderr)
        stored = list((Path(render.store_dir(svc)) / "blobs").iterdir())
        assert len(stored) == 1 and stored[0].read_bytes().startswith(b"GGUF")  # its store, on the model root
        ready = readiness(endpoint(plan, svc), timeout_s=20)
        assert ready["ok"] and ready["models"] == ["tiny-lab:latest"], ready
        assert chat(svc, svc.served_name)["choices"][0]["message"]["content"]
    finally:
        subprocess.run(["docker", "rm", "-f", svc.container_name], capture_output=True)


def test_tokenspeed_unit_starts_on_loopback_with_its_rendered_command_line(image, tmp_path):
    plan, svc = service(tmp_path, hardware="b300", gpu_count=8, model="kimi-k3", engine="tokenspeed",
                        recipe="kimi-k3-tokenspeed-b300")
    try:
        run_container(svc, image)
        ready = readiness(endpoint(plan, svc), timeout_s=20)
        assert ready["ok"] and ready["models"] == ["kimi-k3"], ready
        assert chat(svc, "kimi-k3")["choices"][0]["message"]
        listening = subprocess.run(["ss", "-Hltn", f"sport = :{svc.port}"], capture_output=True, text=True).stdout
        assert listening.split() and all(line.split()[3].startswith("127.0.0.1:") for line in listening.splitlines())
    finally:
        subprocess.run(["docker", "rm", "-f", svc.container_name], capture_output=True)
