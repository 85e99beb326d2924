"""The router stage through pyinfra's @fake connector: a converged front door gets no command; a replica added
to the inventory is registered through the router's worker API and a removed one taken out, with no restart
of the router; a new front door gets its venv, files and unit."""

import hashlib
import json
from pathlib import Path

import pytest

from modelfleet.host import os as osfam  # noqa: E402
from modelfleet.plan import router  # noqa: E402
from modelfleet.plan.inventory import resolve  # noqa: E402
from modelfleet.run import pipeline
from modelfleet.run.stages import TOOLS_BIN  # noqa: E402
from modelfleet.run.stages import router as router_stage  # noqa: E402
from tests.helpers.pem import certificate

KEY = "stage-test-key-0123456"
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "router"


def replica(fabric: str, port: int) -> dict:
    return {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "sglang", "recipe": "tiny-lab-sglang",
            "port": port, "router": "@fake/r1", "router_bind_address": "127.0.0.1", "api_key_env": "MF_STAGE_KEY",
            "fabric_address": fabric}


def inventory(*extra):
    return [("r1", replica("127.0.0.1", 18011)), ("a", replica("127.0.0.2", 18012)), *extra]


@pytest.fixture(autouse=True)
def env(monkeypatch, tmp_path):
    monkeypatch.setenv("MF_STAGE_KEY", KEY)
    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    verified = []
    # A @fake host has no endpoint for the verify gate to reach: record what it would be asked instead.
    monkeypatch.setattr(router_stage, "endpoint_verified", lambda **kwargs: verified.append(kwargs))
    return verified


def front_door(hosts):
    result = resolve([(f"@fake/{n}", d) for n, d in hosts])
    assert result.errors == []
    return result.routers["tiny-lab"]


def state_lines(rp, units_active=True, marker=None) -> list[str]:
    """What DeployedState prints for a router host that has this front door as the stage writes it."""
    def file_line(content, mode):
        return f"file {mode} root root {hashlib.sha256(content.encode()).hexdigest()}"

    p = router.paths(rp)
    files = {router.LAUNCHER: (router.launcher(), 755), p["config"]: (router.launcher_config(rp), 644),
             **{path: (content, 600) for path, content in router.key_files(rp, KEY).items()},
             p["unit"]: (router.render_unit(rp), 644), p["workers"]: (router.workers_file(rp), 644),
             p["lock"]: (router.lock(router.spec(rp)), 644),
             p["installed"]: (router.lock(router.spec(rp)) if marker is None else marker, 644)}
    lines = ["@@modelfleet-state path /etc/modelfleet", "dir 700 root root -",
             f"@@modelfleet-state path {TOOLS_BIN}", "dir 755 root root -"]
    if router.has_admin_key(rp):  # made on the host: its content is the host's own
        files.update({p["admin"]: ("host-made", 600), p["admin_auth"]: ("host-made", 600)})
    for path, (content, mode) in files.items():
        lines += [f"@@modelfleet-state path {path}", file_line(content, mode)]
    lines += [f"@@modelfleet-state unit {rp.unit_name}",
              f"ActiveState={'active' if units_active else 'inactive'}", "UnitFileState=enabled"]
    for package in osfam.family(None).names("router_base"):
        lines += [f"@@modelfleet-state package {package}", "ii  1.0-1"]
    for uid, user in enumerate(router.USERS, 998):
        lines += [f"@@modelfleet-state user {user}", str(uid)]
    return lines


def workers_json(urls) -> str:
    rows = ",".join(f'{{"id":"00000000-0000-0000-0000-00000000000{i}","url":"{u}","is_healthy":true}}'
                    for i, u in enumerate(urls))
    return f'{{"workers":[{rows}],"total":{len(urls)}}}'


def run_router_host(fake, hosts, rp, listed, active=True, marker=None):
    replies = {"@@modelfleet-state": state_lines(rp, active, marker),
               router.list_command(rp): [workers_json(listed)]}
    data = dict(hosts)
    data["r1"] = {**data["r1"], "fake_responses": replies}
    return fake.run_fake([(n, d) for n, d in data.items()], lambda: pipeline.run_stages(router_stage))


def test_a_converged_front_door_gets_no_command(fake, env):
    hosts = inventory()
    rp = front_door(hosts)
    state = run_router_host(fake, hosts, rp, [w.url for w in rp.workers])
    # Two round trips: what the stage finds deployed, and what the router lists; then the verify gate's wait
    # for every replica the door routes to.
    commands = fake.executed(state, "r1")
    assert len(commands) == 3 and router.list_command(rp) in commands[1], commands
    assert commands[2] == router.replicas_ready_script(rp)
    assert fake.executed(state, "a") == []  # a replica host runs no front door
    # The verify gate goes through the front door, asking every inference route of the router without the key.
    (call,) = env
    # Bound on the router host's loopback: reached through its SSH connection.
    assert (call["ep"].base_url, call["ep"].model, call["ep"].api_key, call["tunnel"]) == (
        "http://127.0.0.1:8800", "tiny-lab", KEY, ("127.0.0.1", 8800))
    assert call["ep"].refused_routes == tuple(router.spec(rp).inference_routes)


@pytest.mark.parametrize("marker", ["", "sglang-router==0.3.1 \\\n    --hash=sha256:" + "0" * 64 + "\n"])
def test_a_venv_built_from_another_lock_is_built_again_and_the_router_restarted(fake, env, marker):
    """A venv an older modelfleet marked (an empty marker) or built from another lock: the catalog's lock is
    installed into it afresh (--clear), its marker becomes the lock, and the router restarts on it."""
    hosts = inventory()
    rp = front_door(hosts)
    state = run_router_host(fake, hosts, rp, [w.url for w in rp.workers], marker=marker)
    commands = fake.executed(state, "r1")
    venv, p = router.venv(rp), router.paths(rp)
    assert any(c.startswith(f"python3 -m venv --clear {venv} && ") and
               c.endswith(f"-r {p['lock']} && cp -f {p['lock']} {p['installed']}") for c in commands), commands
    assert f"systemctl restart {rp.unit_name}" in commands


def test_a_new_replica_is_registered_and_a_gone_one_taken_out_without_a_restart(fake, env):
    before = front_door(inventory())
    hosts = inventory(("b", replica("127.0.0.3", 18013)))
    rp = front_door(hosts)
    # The router lists what the inventory had, plus a replica since removed from it.
    listed = [w.url for w in before.workers] + ["http://127.0.0.9:18019"]
    state = run_router_host(fake, hosts, rp, listed)
    commands = fake.executed(state, "r1")
    remove = router.remove_script(rp, "http://127.0.0.9:18019", "00000000-0000-0000-0000-000000000002")
    add = router.add_script(rp, "http://127.0.0.3:18013")
    sent = [c for c in commands if c.startswith("sh -c")]
    assert [c for c in sent if "/workers" in c] == [remove, add]
    assert not any("systemctl restart" in c or "systemctl start" in c for c in commands), commands
    assert env[0]["full"] is True  # the front door changed: smoke and tool probe through it too


def test_a_new_front_door_is_installed_and_started(fake, uploads, monkeypatch, env):
    hosts = inventory()
    rp = front_door(hosts)
    data = dict(hosts)
    data["r1"] = {**data["r1"], "fake_responses": {}}
    state = fake.run_fake(list(data.items()), lambda: pipeline.run_stages(router_stage))
    commands = fake.executed(state, "r1")
    venv, p = router.venv(rp), router.paths(rp)
    # The router's system users, then its venv from the catalog's lock, every wheel's hash checked.
    assert router.users_script() in commands
    assert uploads.files[p["lock"]] == router.lock(router.spec(rp))
    assert (f"python3 -m venv --clear {venv} && {venv}/bin/pip install -q --disable-pip-version-check --require-hashes "
            f"--only-binary=:all: -r {p['lock']} && cp -f {p['lock']} {venv}/.modelfleet-installed") in commands
    assert f"systemctl start {rp.unit_name}" in commands
    assert not any(router.list_command(rp) in c for c in commands)  # it starts with the replicas' file
    # smg's manifest of the replicas, which the unit hands it (and joins and leaves rewrite).
    assert json.loads(uploads.files[p["workers"]]) == {"version": 1, "workers": [
        {"url": "http://127.0.0.1:18011", "model_id": "tiny-lab"}, {"url": "http://127.0.0.2:18012",
                                                                     "model_id": "tiny-lab"}]}
    assert uploads.files[p["key"]] == KEY + "\n" and uploads.files[p["config"]] == router.launcher_config(rp)
    assert not any(KEY in c for c in commands)  # the key only ever travels as a file's content


def test_vllm_front_door_is_nginx_before_the_router_on_loopback(fake, uploads, monkeypatch, env):
    hosts = [(n, {**d, "engine": "vllm", "recipe": "tiny-lab-vllm"}) for n, d in inventory()]
    rp = front_door(hosts)
    state = fake.run_fake(hosts, lambda: pipeline.run_stages(router_stage))
    commands = fake.executed(state, "r1")
    assert any("apt-get" in c and " install " in c and "nginx" in c for c in commands), commands
    assert f"systemctl start {rp.unit_name}" in commands and f"systemctl start {rp.proxy_unit_name}" in commands
    p = router.paths(rp)
    assert KEY in uploads.files[p["proxy_key"]] and KEY not in uploads.files[p["proxy"]]
    folder, _, name = p["proxy_key"].rpartition("/")
    assert any(f"mv -f {folder}/.{name}.modelfleet-tmp {p['proxy_key']}" in c for c in commands)
    assert '"--host",\n  "127.0.0.1",\n  "--port",\n  "8801"' in uploads.files[p["config"]]
    # Its router checks no key: the owner rule (nft, from nftables) goes up for the unit to load, and the gate
    # asks the router's port as nobody once the router runs.
    assert any("apt-get" in c and " install " in c and "nftables" in c for c in commands), commands
    assert uploads.files[p["rule"]] == router.render_rule(rp)
    assert any(f"chmod 0600 {p['rule']}" in c for c in commands)
    assert router.worker_guard_script(rp) in commands


def test_a_drop_in_on_the_router_unit_is_removed_and_the_router_restarted(fake, env):
    hosts = inventory()
    rp = front_door(hosts)
    override = f"/etc/systemd/system/{rp.unit_name}.d/override.conf"
    lines = state_lines(rp)
    at = lines.index(f"@@modelfleet-state unit {rp.unit_name}") + 1
    lines[at:at] = [f"DropInPaths={override}", f"FragmentPath=/etc/systemd/system/{rp.unit_name}"]
    lines += [f"@@modelfleet-state dropin {rp.unit_name} {override}", "= [Service]", "= Environment=ROUTER_EXTRA=1"]
    data = dict(hosts)
    data["r1"] = {**data["r1"], "fake_responses": {"@@modelfleet-state": lines,
                                                   router.list_command(rp): [workers_json(rp_urls(rp))]}}
    commands = fake.executed(fake.run_fake(list(data.items()), lambda: pipeline.run_stages(router_stage)), "r1")
    assert commands.index(f"rm -f -- {override}") < commands.index("systemctl daemon-reload") < commands.index(
        f"systemctl restart {rp.unit_name}")


def rp_urls(rp):
    return [w.url for w in rp.workers]


def test_a_tls_front_door_gets_the_sites_certificate_and_key_as_0600_files(fake, uploads, env, tmp_path):
    cert, key = certificate(tmp_path, names=("IP:127.0.0.1",))
    hosts = [(n, {**d, "engine": "vllm", "recipe": "tiny-lab-vllm", "router_tls_cert": str(cert),
                  "router_tls_key": str(key)}) for n, d in inventory()]
    rp = front_door(hosts)
    commands = fake.executed(fake.run_fake(hosts, lambda: pipeline.run_stages(router_stage)), "r1")
    p = router.paths(rp)
    assert uploads.files[p["tls_cert"]] == cert.read_text() and uploads.files[p["tls_key"]] == key.read_text()
    assert all(written_0600(p[f], commands) for f in ("tls_cert", "tls_key")), commands
    assert not any(key.read_text().splitlines()[1] in c for c in commands)
    assert "listen 127.0.0.1:8800 ssl;" in uploads.files[p["proxy"]]
    assert env[0]["ep"].base_url == "https://127.0.0.1:8800" and env[0]["ep"].ca_file == str(cert)


def test_sglangs_worker_api_key_is_made_on_the_router_host_once(fake, env):
    hosts = inventory()
    rp = front_door(hosts)
    data = dict(hosts)
    data["r1"] = {**data["r1"], "fake_responses": {}}
    commands = fake.executed(fake.run_fake(list(data.items()), lambda: pipeline.run_stages(router_stage)), "r1")
    assert router.admin_key_script(rp) in commands  # a new front door: made there, its content never sent
    converged = fake.executed(run_router_host(fake, hosts, rp, rp_urls(rp)), "r1")
    assert router.admin_key_script(rp) not in converged  # kept: the running router holds it


def test_what_render_previews_for_the_router_host_is_what_the_stage_writes(fake, uploads, env, tmp_path):
    cert, key = certificate(tmp_path, names=("IP:127.0.0.1",))
    for engine, tls in (("vllm", {"router_tls_cert": str(cert), "router_tls_key": str(key)}), ("sglang", {})):
        uploads.files.clear()
        hosts = [(n, {**d, "engine": engine, "recipe": f"tiny-lab-{engine}", **tls}) for n, d in inventory()]
        rp = front_door(hosts)
        data = dict(hosts)
        data["r1"] = {**data["r1"], "fake_responses": {}}
        fake.run_fake(list(data.items()), lambda: pipeline.run_stages(router_stage))
        files, notes = router.preview(rp)
        shown = {f["path"]: f["content"] for f in files}
        masked = {p for p, c in shown.items() if "********" in c}
        assert set(shown) == set(uploads.files), engine  # every file the run writes there, and no other
        assert {p: shown[p] for p in set(shown) - masked} == {p: uploads.files[p] for p in set(shown) - masked}
        assert all(KEY not in c and key.read_text().splitlines()[1] not in c for c in shown.values())
        assert masked == {router.paths(rp)[f] for f in ("key", *(("proxy_key", "tls_key") if tls else ()))}
        assert notes[0].startswith(f"front door tiny-lab: {rp.base_url}/v1 for clients (")
        assert ("TLS with" in notes[0]) == bool(tls) and ("plain HTTP" in notes[0]) != bool(tls)


def test_a_vllm_replica_on_another_host_gets_its_keyed_proxy_before_the_router_registers(fake, uploads, env):
    from modelfleet.plan import replica_door

    hosts = [("r1", {**replica("127.0.0.1", 18011), "engine": "vllm", "recipe": "tiny-lab-vllm"}),
             ("a", {**replica("10.1.0.2", 18012), "engine": "vllm", "recipe": "tiny-lab-vllm"})]
    rp = front_door(hosts)
    assert [w.url for w in rp.workers] == ["http://10.1.0.2:18012", "http://127.0.0.1:18011"]
    state = fake.run_fake(hosts, lambda: pipeline.run_stages(router_stage))
    commands = fake.executed(state, "a")
    svc = front_door_plan(hosts)["@fake/a"].services[0]
    p, unit = replica_door.paths(svc), replica_door.unit_name(svc)
    assert any("apt-get" in c and " install " in c and "nginx" in c for c in commands), commands
    assert f"systemctl start {unit}" in commands and not any("router" in c for c in commands)
    assert "listen 10.1.0.2:18012;" in uploads.files[p["conf"]] and KEY in uploads.files[p["key"]]
    assert written_0600(p["key"], commands) and not any(KEY in c for c in commands)


def written_0600(path: str, commands: list[str]) -> bool:
    """A secret file is made 0600 under a temp name beside `path`, then renamed over it (operations.files)."""
    folder, _, name = path.rpartition("/")
    temp = f"{folder}/.{name}.modelfleet-tmp"
    return any(f"chmod 0600 {temp}" in c for c in commands) and f"mv -f {temp} {path}" in commands


def front_door_plan(hosts):
    return resolve([(f"@fake/{n}", d) for n, d in hosts]).hosts


def test_a_door_whose_replica_is_not_ready_is_reported_degraded_naming_it(fake, env, caplog):
    # SGLang #33740: the router answers /health before its workers; the gate waits for them, then names the rest.
    hosts = inventory()
    rp = front_door(hosts)
    line = ("modelfleet: front door tiny-lab degraded: replicas not ready after 120 s: @fake/a "
            "(http://127.0.0.2:18012/health answered 503)")
    replies = {"@@modelfleet-state": state_lines(rp), router.list_command(rp): [workers_json([w.url for w in
                                                                                               rp.workers])],
               "replicas_ready tiny-lab": {"stdout": ["ready @fake/r1 http://127.0.0.1:18011/health"],
                                           "stderr": [line], "success": False}}
    data = dict(hosts)
    data["r1"] = {**data["r1"], "fake_responses": replies}
    state = fake.run_fake(list(data.items()), lambda: pipeline.run_stages(router_stage))
    assert [h.name for h in state.failed_hosts] == ["@fake/r1"]
    assert f"refused: verify: {line.removeprefix('modelfleet: ')}" in caplog.text
