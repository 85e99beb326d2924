"""The lab's Ollama double (lab/engine_double, invoked as `ollama`) held to Ollama's documented API and recorded
answers (tests/fixtures/ollama/api.json names each one's source), and the unit modelfleet renders for Ollama run
against it: the registration steps (wait for /api/version, `ollama create` from the Modelfile FROM the fetched
file, load with keep_alive -1), then readiness as modelfleet asks it (/api/version, /v1/models listing the served
name with Ollama's :latest). No Ollama binary is reachable here: this is what stands in for it."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from modelfleet.host import units
from modelfleet.plan import render
from modelfleet.run.checks import Endpoint
from modelfleet.run.checks.ready import readiness
from tests.conftest import ROOT
from tests.helpers.listener import free_port
from tests.helpers.recipe_pools import pool

FIXTURES = json.loads((ROOT / "tests" / "fixtures" / "ollama" / "api.json").read_text())
ANSWERS = {a["request"]: a for a in FIXTURES["answers"]}


@pytest.fixture()
def ollama(tmp_path, request):
    """`ollama serve` played by the double: OLLAMA_HOST on loopback, its store in OLLAMA_MODELS; its load time
    (seconds) is the test's parameter where it gives one."""
    exe = tmp_path / "bin" / "ollama"
    exe.parent.mkdir()
    exe.symlink_to(ROOT / "lab" / "engine_double" / "engine_double.py")
    port = free_port()
    env = {**os.environ, "OLLAMA_HOST": f"127.0.0.1:{port}", "OLLAMA_MODELS": str(tmp_path / "store"),
           "MODELFLEET_DOUBLE_LOAD_DELAY_S": str(getattr(request, "param", 0))}
    proc = subprocess.Popen([sys.executable, str(exe), "serve"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(base + "/", timeout=1)
            break
        except OSError:
            time.sleep(0.05)
    yield {"base": base, "exe": exe, "env": env, "port": port, "tmp": tmp_path}
    proc.terminate()
    proc.wait(timeout=10)


def call(base: str, method: str, path: str, body=None, data: bytes | None = None):
    payload = data if data is not None else json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data=payload, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.headers.get("Content-Type", ""), answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Content-Type", ""), error.read().decode()


def test_the_double_answers_as_ollamas_own_routes_do(ollama):
    base = ollama["base"]
    status, kind, text = call(base, "GET", "/")
    assert (status, text) == (200, ANSWERS["GET /"]["body"]) and kind.startswith("text/plain")
    status, _, text = call(base, "GET", "/api/version")
    assert status == 200 and json.loads(text).keys() == ANSWERS["GET /api/version"]["body"].keys()
    head = next(request for request in ANSWERS if request.startswith("HEAD /api/blobs/"))
    assert call(base, "HEAD", head.split(" ", 1)[1])[0] == ANSWERS[head]["status"]
    status, _, text = call(base, "POST", "/api/blobs/sha256:" + "0" * 64, data=b"not those bytes")
    wrong = ANSWERS["POST /api/blobs/<another digest>"]
    assert status == wrong["status"] and json.loads(text)["error"].startswith(wrong["error_starts"])
    # Before a model is registered it serves none: /v1/models is empty, /health does not exist.
    assert json.loads(call(base, "GET", "/v1/models")[2])["data"] == []
    assert call(base, "GET", "/health")[0] == 404


def test_the_rendered_registration_serves_the_fetched_file_as_ollama_does(ollama, monkeypatch):
    """modelfleet's own Modelfile and unit steps, run against the double: the model is listed and answers."""
    result = pool("tiny-lab-ollama", "lab-cpu", port=ollama["port"])
    assert result.errors == [], result.errors
    svc = result.hosts["n0"].services[0]
    gguf = ollama["tmp"] / "model" / "tiny-lab.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    modelfile = ollama["tmp"] / "Modelfile"
    written = {path: content for path, content, _, _ in units.unit_files(svc)}[render.modelfile_path(svc)]
    assert written == f"FROM {render.CONTAINER_MODEL_DIR}/tiny-lab.gguf\n"  # the fetched file, never a hub name
    modelfile.write_text(written.replace(render.CONTAINER_MODEL_DIR, str(gguf.parent)))
    steps = [shlex.split(step.replace("\\\n", " ").replace("$$", "$")) for step in render.registration_steps(svc)]
    wait, create, load = steps
    assert subprocess.run(wait, timeout=30).returncode == 0
    create = create[create.index("/bin/ollama"):]  # what `docker exec CONTAINER` runs inside it
    assert create[:2] == ["/bin/ollama", "create"] and create[-2:] == ["-f", render.CONTAINER_MODELFILE]
    out = subprocess.run([sys.executable, str(ollama["exe"]), *create[1:-1], str(modelfile)], env=ollama["env"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "success"
    assert subprocess.run(load, capture_output=True, timeout=30).returncode == 0  # curl -f: a 2xx answer
    doc = ANSWERS["POST /api/generate"]["body"]
    status, _, text = call(ollama["base"], "POST", "/api/generate", {"model": "tiny-lab"})
    assert status == 200 and json.loads(text).keys() >= doc.keys() and json.loads(text)["done"] is True
    listed = json.loads(call(ollama["base"], "GET", "/v1/models")[2])
    assert listed["data"][0].keys() == ANSWERS["GET /v1/models"]["body"]["data"][0].keys()
    assert [m["id"] for m in listed["data"]] == [render.listed_name(svc)] == ["tiny-lab:latest"]
    ep = Endpoint(name="n0/p", base_url=svc.base_url, model=svc.served_name, engine="ollama",
                  health_path=svc.engine.health_path, listed=render.listed_name(svc))
    assert readiness(ep, timeout_s=5)["ok"]
    status, _, text = call(ollama["base"], "POST", "/v1/chat/completions",
                           {"model": "tiny-lab", "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and json.loads(text)["choices"][0]["message"]["content"]


def test_the_create_stream_is_ollamas_documented_one(ollama):
    """POST /api/create after the blob is pushed answers the documented stream, status by status."""
    data = b"GGUF-test"

    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert call(ollama["base"], "POST", f"/api/blobs/{digest}", data=data)[0] == 201
    assert call(ollama["base"], "HEAD", f"/api/blobs/{digest}")[0] == 200
    status, kind, text = call(ollama["base"], "POST", "/api/create",
                              {"model": "my-gguf-model", "files": {"test.gguf": digest}})
    documented = [line["status"].split(" sha256:")[0] for line in ANSWERS["POST /api/create"]["stream"]]
    assert status == 200 and [json.loads(line)["status"].split(" sha256:")[0] for line in text.splitlines()] == \
        documented


@pytest.mark.parametrize("ollama", [2], indirect=True)
def test_a_chat_while_the_model_loads_waits_for_it_as_ollama_does(ollama):
    """Ollama loads a model on its first request and answers it then: no 503 while loading (the CI flake of
    stop 56 was the double answering one)."""
    data = b"GGUF" + bytes(8)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert call(ollama["base"], "POST", f"/api/blobs/{digest}", data=data)[0] == 201
    assert call(ollama["base"], "POST", "/api/create", {"model": "m", "files": {"m.gguf": digest}})[0] == 200
    started = time.monotonic()
    status, _, text = call(ollama["base"], "POST", "/v1/chat/completions",
                           {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and json.loads(text)["choices"][0]["message"]["content"], text
    assert time.monotonic() - started > 0.5  # it did wait for the load
