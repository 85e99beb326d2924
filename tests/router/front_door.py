"""What the router e2e tests share: the real router binary (its PyPI wheel, in a venv built once in the cache
outside the checkout) and Debian's nginx started from the product's own launcher, launcher config, key files and
proxy config (modelfleet.plan.router), engine doubles as plain processes on loopback, and client threads that count
every failed chat request sent through the front door."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from lab.engine_parsers import cache_root
from modelfleet.plan import router
from modelfleet.plan.inventory.plan import RouterPlan
from modelfleet.run.stages.router import PROXY_PACKAGE

ROOT = Path(__file__).resolve().parents[2]
DOUBLE = ROOT / "lab" / "engine_double" / "engine_double.py"
KEY = "front-door-e2e-key-7f3a"
SERVED = "tiny-lab"
CLIENTS = 3


def _reachable(host: str, port: int = 443) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
        return True
    except OSError:
        return False


def router_venv(spec: router.RouterSpec) -> Path:
    """The router's wheels in a venv of its own, installed as the stage does (the catalog's lock, every hash
    required), built once per lock (a half-built one is built again)."""
    import hashlib

    lock = router.lock(spec)
    target = cache_root() / f"router-{spec.package}-{spec.version}-{hashlib.sha256(lock.encode()).hexdigest()[:8]}"
    if (target / ".built").exists():
        return target
    if not _reachable("pypi.org"):
        pytest.skip(f"PyPI (pypi.org:443) is unreachable: cannot install {spec.package}=={spec.version}")
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    subprocess.run(["python3", "-m", "venv", str(partial)], check=True)
    (partial / "requirements.txt").write_text(lock)
    pip = subprocess.run([str(partial / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                          "--require-hashes", "--only-binary=:all:", "-r", str(partial / "requirements.txt")],
                         capture_output=True, text=True)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    (partial / ".built").touch()
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


def nginx_binary() -> Path:
    """Debian's nginx package, unpacked (not installed) into the cache."""
    target = cache_root() / "nginx-deb"
    binary = target / "usr" / "sbin" / "nginx"
    if binary.exists():
        return binary
    if not shutil.which("apt-get") or not shutil.which("dpkg"):
        pytest.skip("no apt-get/dpkg here to fetch Debian's nginx package")
    download = cache_root() / "nginx-download"
    shutil.rmtree(download, ignore_errors=True)
    download.mkdir(parents=True)
    got = subprocess.run(["apt-get", "download", PROXY_PACKAGE], cwd=download, capture_output=True, text=True)
    debs = list(download.glob("nginx_*.deb"))
    if got.returncode or not debs:
        pytest.skip(f"Debian's nginx package could not be fetched: {got.stderr.strip()[-200:]}")
    subprocess.run(["dpkg", "-x", str(debs[0]), str(target)], check=True)
    return binary


def free_base_port(span: int) -> int:
    """A port with the next `span - 1` free too (the front door, the router behind it, its metrics)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + span < 65535 and all(_free(base + i) for i in range(span)):
            return base
    raise RuntimeError("no free ports")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def wait_for(check, timeout_s: float, what: str):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if check():
                return
        except (OSError, urllib.error.URLError, ValueError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s: {what}")


def http(method: str, url: str, body: dict | None = None, key: str | None = None, timeout: float = 30):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


class Replica:
    """An engine double played as `engine` at `address:port` (a free loopback port unless given), reporting
    `version` as its image's (MODELFLEET_DOUBLE_VERSION); its log counts the chats it served."""

    def __init__(self, engine: str, workdir: Path, index: int, address: str = "127.0.0.1", port: int | None = None,
                 version: str | None = None, key: str = KEY):
        self.port = port or free_base_port(1)
        self.url = f"http://{address}:{self.port}"
        launcher = workdir / "bin" / engine
        launcher.parent.mkdir(exist_ok=True)
        if not launcher.exists():
            launcher.symlink_to(DOUBLE)  # the double plays the engine its argv[0] names
        model = ["--model-path", "/models/tiny"] if engine == "sglang" else ["/models/tiny"]
        argv = [sys.executable, str(launcher), "serve", *model, "--served-model-name", SERVED, "--host",
                address, "--port", str(self.port), "--api-key", key]
        self.log = workdir / f"replica-{index}{'-' + version if version else ''}.log"
        env = {**os.environ, "MODELFLEET_DOUBLE_LOAD_DELAY_S": "0"}
        if version:
            env["MODELFLEET_DOUBLE_VERSION"] = version
        self.proc = subprocess.Popen(argv, stdout=self.log.open("w"), stderr=subprocess.STDOUT, env=env)
        wait_for(lambda: http("GET", f"{self.url}/health", timeout=2)[0] == 200, 20, f"replica {self.url}")

    def served(self) -> int:
        return self.log.read_text().count('"POST /v1/chat/completions HTTP/1.1" 200')

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


class Clients:
    """Client threads sending chat requests through the front door until stopped; every failure is kept."""

    def __init__(self, base_url: str):
        self.base_url, self.ok, self.failed, self.stopping = base_url, 0, [], threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(CLIENTS)]

    def _run(self):
        body = {"model": SERVED, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 16}
        while not self.stopping.is_set():
            try:
                status, raw = http("POST", f"{self.base_url}/v1/chat/completions", body, KEY)
                good = status == 200 and json.loads(raw)["choices"][0]["message"]["role"] == "assistant"
                reason = None if good else f"{status}: {raw[:200]!r}"
            except Exception as error:  # noqa: BLE001 - any failure a client would see is counted
                reason = f"{type(error).__name__}: {error}"
            with self.lock:
                if reason:
                    self.failed.append(reason)
                else:
                    self.ok += 1

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=60)


def sh(script: str):
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def start_front_door(rp: RouterPlan, workdir: Path) -> list[subprocess.Popen]:
    """The router (and nginx before it where its router checks no key) as the router stage writes them, with
    `rp.config_dir` for /etc/modelfleet; waits until the router answers /health. The router's process first."""
    spec = router.spec(rp)
    venv = router_venv(spec)
    nginx = nginx_binary() if router.behind_proxy(rp) else None
    sh(router.users_script())  # nginx's workers and modelfleet's worker calls run as these users
    paths = router.paths(rp)
    Path(paths["config"]).write_text(router.launcher_config(rp))
    Path(paths["workers"]).write_text(router.workers_file(rp))
    for path, content in router.key_files(rp, KEY).items():
        Path(path).write_text(content)
        os.chmod(path, 0o600)
    if router.has_admin_key(rp):
        sh(router.admin_key_script(rp))
    launcher = workdir / "modelfleet_router.py"
    launcher.write_text(router.launcher())
    # As the unit does: the router reads copies of its files in its runtime directory (where modelfleet then
    # rewrites the manifest a watching router reads).
    router.RUNTIME_ROOT = str(workdir / "run")
    runtime = Path(router.runtime_dir(rp))
    runtime.mkdir(parents=True, mode=0o700)
    for path in router.handed(rp):
        shutil.copy(path, runtime)
    procs = [subprocess.Popen([str(venv / "bin" / "python"), str(launcher), paths["config"]],
                              env={**os.environ, "MODELFLEET_ROUTER_FILES": str(runtime)},
                              stdout=(workdir / "router.log").open("w"), stderr=subprocess.STDOUT)]
    if nginx:
        runtime = workdir / "door"
        runtime.mkdir()
        # The clients' keys (router_client_keys_env, else the model's), the replicas' own where they differ.
        Path(paths["proxy_key"]).write_text(router.proxy_key_conf(router.client_keys(rp) if rp.client_keys_env
                                                                  else KEY, KEY if rp.client_keys_env else None))
        Path(paths["proxy"]).write_text(router.render_proxy(rp, runtime=str(runtime)))
        conf = ["-e", "stderr", "-p", str(runtime), "-c", paths["proxy"]]
        sh(f"{nginx} -t -q {' '.join(conf)}")
        procs.append(subprocess.Popen([str(nginx), *conf], stdout=(workdir / "nginx.log").open("w"),
                                      stderr=subprocess.STDOUT))
    wait_for(lambda: http("GET", f"{router.local_url(rp)}/health", timeout=2)[0] == 200, 60,
             f"{spec.package} answers /health ({(workdir / 'router.log').read_text()[-2000:]})")
    return procs


def listed(rp: RouterPlan) -> dict:
    """The router's replicas, through the worker-API command `modelfleet status` runs."""
    return router.parse_workers(sh(router.list_command(rp))) or {}


def stop_all(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
