"""The front door (modelfleet.plan.router): the files the router host gets, and the worker API's commands and parser,
held to the real routers' recorded answers. The plan from the inventory's `router*` settings:
test_inventory_routed.py; the routers catalog held to the real routers' help: test_catalog_routers.py."""

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from modelfleet.plan import render, router
from modelfleet.plan.inventory import resolve
from modelfleet.plan.inventory.plan import RouterPlan, Worker
from modelfleet.run.stages.router import registration
from tests.helpers import front_doors
from tests.helpers.front_doors import KEY, fleet, recorded
from tests.helpers.pem import certificate, private_key


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("MF_ROUTER_KEY", KEY)


def test_the_key_is_in_no_unit_config_or_command():
    for engine in ("vllm", "sglang"):
        rp = resolve(fleet(engine)).routers["tiny-lab"]
        rendered = [router.render_unit(rp), router.launcher_config(rp), router.workers_file(rp),
                    router.list_command(rp), router.add_script(rp, "http://10.1.0.9:8000"),
                    router.remove_script(rp, "http://10.1.0.2:8000", "x"), router.health_script(rp)]
        if router.behind_proxy(rp):
            rendered += [router.render_proxy(rp), router.render_proxy_unit(rp)]
        assert not any(KEY in text for text in rendered), engine
    assert KEY in router.proxy_key_conf(KEY)  # only in the 0600 file the proxy includes


def test_sglangs_front_door_is_smg_checking_the_key_itself_and_reading_a_manifest_of_its_replicas():
    rp = resolve(fleet("sglang")).routers["tiny-lab"]
    config = json.loads(router.launcher_config(rp))
    assert config == {"module": "smg.launch_router",
                      "args": ["--host", "10.0.0.1", "--port", "8800", "--policy", "cache_aware",
                               "--health-check-interval-secs", "10", "--health-check-endpoint", "/health",
                               "--health-failure-threshold", "3", "--prometheus-host", "127.0.0.1",
                               "--prometheus-port", "8802"],
                      # Its replicas come from the manifest it was handed, which it watches: no registration.
                      "discovery_args": ["--discovery-provider", "file", "--discovery-file", "{manifest}",
                                         "--discovery-check-interval-secs", "10"],
                      "workers_file": "/etc/modelfleet/router-tiny-lab.workers",
                      "api_key_flag": "--api-key", "key_file": "/etc/modelfleet/router-tiny-lab.key",
                      # The worker API takes a key of its own, made on the router host, that no client holds.
                      "admin_keys_flag": "--control-plane-api-keys",
                      "admin_key_file": "/etc/modelfleet/router-tiny-lab.admin"}
    assert ("ExecStart=/opt/modelfleet/router-smg-1.13.0/bin/python \\\n"
            "    /opt/modelfleet/bin/modelfleet_router.py \\\n    /etc/modelfleet/router-tiny-lab.json\n"
            ) in router.render_unit(rp)
    assert json.loads(router.workers_file(rp)) == {"version": 1, "workers": [
        {"url": f"http://{a}:30000", "model_id": "tiny-lab"} for a in ("10.1.0.2", "10.1.0.3", "127.0.0.1")]}
    assert router.live_manifest(rp) == "/run/modelfleet-router-tiny-lab/router-tiny-lab.workers"
    # Joining and leaving rewrite that manifest; no call to the worker API (which only lists, with its key).
    for script in (router.add_script(rp, "http://10.1.0.9:30000"), router.remove_script(rp, "http://10.1.0.2:30000",
                                                                                          "id-1")):
        assert "/run/modelfleet-router-tiny-lab/router-tiny-lab.workers" in script and "-X POST" not in script
        assert "-X DELETE" not in script
    assert "-H @/etc/modelfleet/router-tiny-lab.admin-auth" in router.list_command(rp)


def _manifest_edit(rp, action: str, url: str):
    return subprocess.run(router.edit_manifest_script(rp, action, url), shell=True, capture_output=True, text=True)


def test_the_manifest_edit_keeps_the_router_users_file_and_never_follows_a_link(tmp_path, monkeypatch):
    monkeypatch.setattr(router, "RUNTIME_ROOT", str(tmp_path))
    rp = resolve(fleet("sglang")).routers["tiny-lab"]
    live = Path(router.live_manifest(rp))
    live.parent.mkdir(mode=0o700)
    live.write_text(router.workers_file(rp))
    assert _manifest_edit(rp, "add", "http://10.1.0.9:30000").returncode == 0
    assert _manifest_edit(rp, "remove", "http://10.1.0.2:30000").returncode == 0
    assert _manifest_edit(rp, "add", "http://10.1.0.9:30000").returncode == 0  # already in: once
    assert [w["url"] for w in json.loads(live.read_text())["workers"]] == [
        "http://10.1.0.3:30000", "http://127.0.0.1:30000", "http://10.1.0.9:30000"]
    assert oct(live.stat().st_mode & 0o777) == "0o400" and list(live.parent.iterdir()) == [live]
    # The router's user owns the directory: a link it plants where the manifest was is neither read nor
    # written through.
    target = tmp_path / "root-only"
    target.write_text('{"version": 1, "workers": []}')
    live.unlink()
    live.symlink_to(target)
    refused = _manifest_edit(rp, "add", "http://10.1.0.8:30000")
    assert refused.returncode != 0 and "cannot read the router's manifest" in refused.stderr
    assert target.read_text() == '{"version": 1, "workers": []}' and live.is_symlink()


def test_vllm_router_listens_on_loopback_behind_the_proxy():
    rp = resolve(fleet("vllm")).routers["tiny-lab"]
    assert json.loads(router.launcher_config(rp))["args"][:4] == ["--host", "127.0.0.1", "--port", "8801"]
    proxy = router.render_proxy(rp)
    assert "listen 10.0.0.1:8800;" in proxy and "server 127.0.0.1:8801;" in proxy
    assert "include /etc/modelfleet/door-tiny-lab.key.conf;" in proxy
    assert "user modelfleet-door modelfleet-door;" in proxy
    # modelfleet's own calls to the router's port run as the router's user (the owner rule lets it in).
    assert router.list_command(rp) == ("setpriv --reuid=modelfleet-router --regid=modelfleet-router --clear-groups -- "
                                       "curl -fsS -m 10 -X GET http://127.0.0.1:8801/workers 2>/dev/null || true")
    assert "'http://127.0.0.1:8801/add_worker?url=http%3A%2F%2F10.1.0.9%3A8000'" in router.add_script(
        rp, "http://10.1.0.9:8000")


def test_worker_lists_parse_from_the_real_routers():
    assert router.parse_workers(recorded("smg-1.13.0-workers.json.txt")) == {
        "http://127.0.0.1:39011": {"id": "01a24f38-e9b0-7405-997c-be94d2c6fb25", "healthy": True}}
    assert router.parse_workers(recorded("sglang-router-0.3.2-workers.json.txt")) == {
        "http://127.0.0.1:18011": {"id": "5f82aa8a-36fe-4a6b-b293-692ef30f268b", "healthy": True},
        "http://127.0.0.1:18012": {"id": "f258c45a-db51-4bbe-8746-d7f7b7cb5430", "healthy": True}}
    assert router.parse_workers(recorded("vllm-router-0.1.17-list_workers.json.txt")) == {
        "http://127.0.0.1:18002": {"id": "http://127.0.0.1:18002", "healthy": None},
        "http://127.0.0.1:18001": {"id": "http://127.0.0.1:18001", "healthy": None}}
    assert router.parse_workers(recorded("vllm-router-0.1.17-workers.json.txt")) == {
        "http://127.0.0.1:18002": {"id": "http://127.0.0.1:18002", "healthy": True},
        "http://127.0.0.1:18001": {"id": "http://127.0.0.1:18001", "healthy": True}}
    assert router.parse_workers("") is None  # the router did not answer


def test_registration_adds_the_new_removes_the_gone_and_leaves_the_rest():
    rp = RouterPlan(name="tiny-lab", host="r1", engine_name="sglang", served_name="tiny-lab",
                    bind_address="127.0.0.1", port=8800, policy="round_robin", api_key_env="MF_ROUTER_KEY",
                    config_dir="/etc/modelfleet",
                    workers=(Worker("a", "a", "http://127.0.0.1:18011"), Worker("c", "c", "http://127.0.0.1:18013")))
    listed = router.parse_workers(recorded("sglang-router-0.3.2-workers.json.txt"))
    remove, add = registration(rp, listed)
    assert list(remove) == ["http://127.0.0.1:18012"] and list(add) == ["http://127.0.0.1:18013"]
    # smg drains what its manifest no longer lists: the script takes the URL out of it.
    assert "remove /run/modelfleet-router-tiny-lab/router-tiny-lab.workers http://127.0.0.1:18012" in remove[
        "http://127.0.0.1:18012"]
    converged = RouterPlan(**{**rp.__dict__, "workers": tuple(Worker(u, u, u) for u in listed)})
    assert registration(converged, listed) == ({}, {})


def test_the_verify_gate_asks_the_front_door_every_route_and_a_routed_replica_its_open_ones():
    from modelfleet.run.checks import endpoint, exposure
    from modelfleet.run.stages.router import front_door_endpoint

    result = resolve(fleet("sglang"))
    replica = endpoint(result.hosts["a"], result.hosts["a"].services[0])
    asked, unasked = exposure.routes_to_ask(replica)
    # A replica on the fabric is asked its engine's own inference route too: nothing vouches for it there.
    assert [route for route, _ in asked] == ["/v1/chat/completions", "/generate"] and unasked == []
    for engine in ("vllm", "sglang"):
        door = front_door_endpoint(resolve(fleet(engine)).routers["tiny-lab"], KEY)
        asked, unasked = exposure.routes_to_ask(door)
        assert [route for route, _ in asked] == router.specs()[engine].inference_routes and unasked == []


def test_the_router_host_asks_every_replica_off_loopback_each_route_that_runs_the_model():
    rp = resolve(fleet("sglang")).routers["tiny-lab"]
    # The replica beside the router (loopback) is not asked; the two on the fabric are, on every model route.
    assert router.replica_probes(rp) == [(h, f"http://10.1.0.{n}:30000{route}") for h, n in (("a", 2), ("b", 3))
                                         for route in ("/v1/chat/completions", "/generate")]
    vllm = RouterPlan(**{**rp.__dict__, "engine_name": "vllm",
                         "workers": (Worker("p", "gpu-2", "http://10.1.0.2:8000"),)})
    routes = [url.removeprefix("http://10.1.0.2:8000") for _, url in router.replica_probes(vllm)]
    assert routes[:2] == ["/v1/chat/completions", "/invocations"] and "/pooling" in routes and "/score" in routes
    script = router.replica_exposure_script(rp)
    assert script.startswith("sh -c ") and "http://10.1.0.3:30000/generate" in script and KEY not in script
    assert router.replica_exposure_script(resolve(fleet("vllm")).routers["tiny-lab"]) is None  # loopback only


def test_tls_needs_both_files_pem_on_the_control_node_and_nginx_before_the_router(tmp_path):
    cert, key = certificate(tmp_path)

    def errors(engine="vllm", **tls):
        return [(w, f, m) for w, f, m in resolve(fleet(engine, **tls)).errors]

    assert errors(router_tls_cert=str(cert), router_tls_key=str(key)) == []
    assert [(w, f) for w, f, _ in errors(router_tls_cert=str(cert))] == [("router tiny-lab", "router_tls_key")]
    # SGLang's router, which checks its key itself, gets nginx before it for TLS (itself on loopback).
    assert errors("sglang", router_tls_cert=str(cert), router_tls_key=str(key)) == []
    sglang = resolve(fleet("sglang", router_tls_cert=str(cert), router_tls_key=str(key))).routers["tiny-lab"]
    assert router.behind_proxy(sglang) and router.listen(sglang) == ("127.0.0.1", 8801)
    assert not router.behind_proxy(resolve(fleet("sglang")).routers["tiny-lab"])
    swapped = errors(router_tls_cert=str(key), router_tls_key=str(cert))
    assert {(w, f) for w, f, _ in swapped} >= {("router tiny-lab", "router_tls_cert"), ("router tiny-lab",
                                                                                       "router_tls_key")}
    assert not any("PRIVATE" in m or "BEGIN" in m for _, _, m in swapped), swapped
    missing = errors(router_tls_cert=str(tmp_path / "nope.crt"), router_tls_key=str(key))
    assert missing == [("router tiny-lab", "router_tls_cert", f"{tmp_path}/nope.crt: cannot be read on the control "
                        "node (No such file or directory)")]
    rp = resolve(fleet("vllm", router_tls_cert=str(cert), router_tls_key=str(key))).routers["tiny-lab"]
    assert rp.base_url == "https://10.0.0.1:8800"
    proxy = router.render_proxy(rp)
    assert "listen 10.0.0.1:8800 ssl;" in proxy and "ssl_certificate /etc/modelfleet/door-tiny-lab.crt;" in proxy
    assert "ssl_certificate_key /etc/modelfleet/door-tiny-lab.tls-key;" in proxy and "secret-bytes" not in proxy
    assert router.tls_files(rp) == {"/etc/modelfleet/door-tiny-lab.crt": cert.read_text(),
                                    "/etc/modelfleet/door-tiny-lab.tls-key": key.read_text()}
    plain = resolve(fleet("vllm")).routers["tiny-lab"]
    assert plain.base_url == "http://10.0.0.1:8800" and router.tls_files(plain) == {}
    assert "listen 10.0.0.1:8800;" in router.render_proxy(plain) and "Plain HTTP" in router.render_proxy(plain)


def test_the_worker_api_key_is_made_0600_once_and_kept(tmp_path):
    import subprocess

    rp = RouterPlan(name="tiny-lab", host="r1", engine_name="sglang", served_name="tiny-lab", bind_address="10.0.0.1",
                    port=8800, policy="round_robin", api_key_env="MF_ROUTER_KEY", config_dir=str(tmp_path), workers=())
    p = router.paths(rp)
    subprocess.run(router.admin_key_script(rp), shell=True, check=True)
    key, header = Path(p["admin"]).read_text(), Path(p["admin_auth"]).read_text()
    assert re.fullmatch(r"[0-9a-f]{64}\n", key) and header == f"Authorization: Bearer {key}"
    assert all(Path(p[f]).stat().st_mode & 0o777 == 0o600 for f in ("admin", "admin_auth"))
    subprocess.run(router.admin_key_script(rp), shell=True, check=True)
    assert Path(p["admin"]).read_text() == key and sorted(x.name for x in tmp_path.iterdir()) == [
        "router-tiny-lab.admin", "router-tiny-lab.admin-auth"]  # kept, and no temporary file left
    assert key.strip() not in router.admin_key_script(rp)


def test_render_of_the_router_host_shows_the_front_doors_files_masked_and_says_plain_http(tmp_path):
    from click.testing import CliRunner

    from modelfleet.cli import main

    inv = tmp_path / "inv.py"
    inv.write_text(f"gpus = {fleet('vllm')!r}\n")
    out = CliRunner().invoke(main, ["render", "--json", str(inv), "r1"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    files = {f["path"]: f for f in report["files"]}
    rp = resolve(fleet("vllm")).routers["tiny-lab"]
    p = router.paths(rp)
    assert {p["unit"], p["config"], p["workers"], p["proxy"], p["proxy_unit"], p["proxy_key"], p["key"]} <= set(files)
    assert files[p["proxy"]]["content"] == router.render_proxy(rp) and KEY not in out.output
    assert files[p["key"]]["mode"] == "0600" and files[p["key"]]["content"] == "********\n"
    assert any("http://10.0.0.1:8800/v1 for clients (plain HTTP" in n for n in report["notes"])
    text = CliRunner().invoke(main, ["render", str(inv), "r1"]).output
    assert f"# ==> {p['proxy_key']} (0600)" in text and KEY not in text


def test_every_file_a_front_door_writes_in_the_config_dir_is_one_modelfleet_owns(tmp_path):
    from modelfleet.host.operations.files import foreign_entries

    cert = tmp_path / "c.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    (tmp_path / "k.pem").write_text(private_key().splitlines()[0] + "\n")
    for engine in ("vllm", "sglang"):
        rp = resolve(fleet(engine)).routers["tiny-lab"]
        names = [Path(path).name for path in router.paths(rp).values() if path.startswith(rp.config_dir + "/")]
        # A config dir holding them (and no marker: one that existed before modelfleet) is still modelfleet's.
        assert foreign_entries({"kind": "dir", "entries": names}) == [], engine
    assert foreign_entries({"kind": "dir", "entries": ["router.key", "door.conf", "site.crt"]}) == [
        "router.key", "door.conf", "site.crt"]  # nothing wider than the front door's own names


def test_clients_keys_are_a_list_of_control_node_variables_and_the_replicas_get_the_doors_own(monkeypatch):
    monkeypatch.setenv("MF_CLIENT_OLD", "client-old-key-1111")
    monkeypatch.setenv("MF_CLIENT_NEW", "client-new-key-2222")
    keys = ["MF_CLIENT_OLD", "MF_CLIENT_NEW"]
    result = resolve(fleet("vllm", router_client_keys_env=keys))
    assert result.errors == []
    rp = result.routers["tiny-lab"]
    assert router.client_keys(rp) == ["client-old-key-1111", "client-new-key-2222"]
    conf = router.proxy_key_conf(router.client_keys(rp), KEY)
    assert '"~^Bearer client-old-key-1111$" 1;' in conf and '"~^Bearer client-new-key-2222$" 1;' in conf
    assert f'default "Bearer {KEY}";' in conf and f'"~^Bearer {KEY}$"' not in conf  # the replicas' key: not a client's
    assert "proxy_set_header Authorization $modelfleet_upstream_authorization;" in router.render_proxy(rp)
    assert "$modelfleet_upstream_authorization" not in router.render_proxy(resolve(fleet("vllm")).routers["tiny-lab"])
    files, _ = router.preview(rp)
    shown = next(f["content"] for f in files if f["path"] == router.paths(rp)["proxy_key"])
    assert "MF_CLIENT_OLD" in shown and "client-old" not in shown and KEY not in shown
    host_gets = router.proxy_key_file(rp)  # what render shows is the host's file, each key masked
    for value in ("client-old-key-1111", "client-new-key-2222", KEY):
        host_gets = host_gets.replace(value, render.MASK)
    assert shown == host_gets
    # Refused naming the front door and field: unset, the replicas' own key, a router that checks one key itself.
    monkeypatch.setenv("MF_CLIENT_SAME", KEY)
    problems = resolve(fleet("vllm", router_client_keys_env=["MF_CLIENT_NONE", "MF_CLIENT_SAME"])).errors
    assert [(w, f) for w, f, _ in problems] == [("router tiny-lab", "router_client_keys_env")] * 2
    assert "MF_CLIENT_NONE is not set" in problems[0][2] and KEY not in problems[1][2]
    # SGLang's router checks one key (its --api-key, also the replicas'): nginx before it takes the clients' keys.
    sglang = resolve(fleet("sglang", router_client_keys_env=keys))
    assert sglang.errors == [] and router.behind_proxy(sglang.routers["tiny-lab"])


def test_validate_lists_the_front_doors_with_their_url_and_replicas(tmp_path):
    from click.testing import CliRunner

    from modelfleet.cli import main

    inv = tmp_path / "inv.py"
    inv.write_text(f"gpus = {fleet('sglang')!r}\n")
    out = CliRunner().invoke(main, ["validate", "--json", str(inv)])
    assert out.exit_code == 0, out.output
    (door,) = json.loads(out.output)["front_doors"]
    assert (door["name"], door["host"], door["url"], door["tls"], door["proxy"]) == (
        "tiny-lab", "r1", "http://10.0.0.1:8800/v1", False, False)
    assert [r["url"] for r in door["replicas"]] == ["http://10.1.0.2:30000", "http://10.1.0.3:30000",
                                                    "http://127.0.0.1:30000"]
    assert door["client_keys_env"] == ["MF_ROUTER_KEY"] and KEY not in out.output
    text = CliRunner().invoke(main, ["validate", str(inv)]).output
    assert "front door tiny-lab on r1: http://10.0.0.1:8800/v1 (plain HTTP), 3 replica(s)" in text


def test_the_router_runs_as_its_own_user_and_its_unit_loads_the_owner_rule_where_the_router_checks_no_key():
    vllm = resolve(fleet("vllm")).routers["tiny-lab"]
    unit, p = router.render_unit(vllm), router.paths(vllm)
    assert "User=modelfleet-router\nGroup=modelfleet-router\n" in unit
    # Root's 0600 files are copied for the router's user into its runtime directory (the launcher reads them there).
    assert ("RuntimeDirectory=modelfleet-router-tiny-lab\nRuntimeDirectoryMode=0700\n"
            "Environment=MODELFLEET_ROUTER_FILES=%t/modelfleet-router-tiny-lab\n") in unit
    assert (f"ExecStartPre=+/usr/bin/install -m 0400 -o modelfleet-router -g modelfleet-router {p['config']} "
            f"{p['workers']} {p['key']} /run/modelfleet-router-tiny-lab/\n") in unit
    assert f"ExecStartPre=+/usr/sbin/nft -f {p['rule']}\n" in unit
    assert "ExecStopPost=-+/usr/sbin/nft delete table inet modelfleet-router-tiny-lab\n" in unit
    rule = router.render_rule(vllm)
    assert ('oifname "lo" tcp dport 8801 meta skuid != { "modelfleet-door", "modelfleet-router" } reject with tcp '
            "reset") in rule
    files = {f["path"]: f for f in router.preview(vllm)[0]}
    assert files[p["rule"]]["content"] == rule and files[p["rule"]]["mode"] == "0600"
    # A host that takes no nftables rules (the lab's): no rule, said in the preview.
    lab = resolve(fleet("vllm", router_worker_firewall=False)).routers["tiny-lab"]
    assert "nft" not in router.render_unit(lab) and router.worker_guard_script(lab) is None
    assert "router_worker_firewall is off: any local process reaches the router" in " ".join(router.preview(lab)[1])
    # SGLang's router checks its own keys (its worker API takes only modelfleet's): no rule, calls as root.
    sglang = resolve(fleet("sglang")).routers["tiny-lab"]
    assert "nft" not in router.render_unit(sglang) and not router.list_command(sglang).startswith("setpriv")
    assert "User=modelfleet-router" in router.render_unit(sglang)


def test_the_door_forwards_with_a_key_only_the_model_routes_matched_on_the_request_line():
    rp = resolve(fleet("vllm")).routers["tiny-lab"]
    pattern = re.compile(router.client_route_pattern(rp))
    for path in ("/v1/chat/completions", "/invocations", "/v1/models", "/v1/responses/resp_1/cancel",
                 "/v1/completions?x=1", "/metrics"):
        assert pattern.match(path), path
    for path in ("/flush_cache", "/add_worker?url=x", "/workers", "/v1/../flush_cache", "/v1/chat/completions/x",
                 "/pause", "/v1/responses/a/b", "/v1/responses/%2e%2e/x", "/health/../workers"):
        assert not pattern.match(path), path


@pytest.mark.parametrize("python", ["3.10", "3.11", "3.12", "3.13"])
def test_each_router_lock_pins_one_version_of_each_package_for_every_python_the_hosts_run(python):
    """os.yaml's releases run Python 3.10 (Ubuntu 22.04) to 3.13: each router lock holds, for each, one pinned
    version of every package with its hashes, with the router release itself; on 3.10 what aiohttp and anyio
    need there alone (async-timeout, exceptiongroup)."""
    from packaging.markers import Marker

    env = {"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "os_name": "posix"}
    for s in router.specs().values():
        lock = router.lock(s)
        held = [name for name, _, marker in re.findall(r"^([a-z0-9-]+)==(\S+)(?: ; ([^\\\n]*))? \\$", lock, re.M)
                if not marker or Marker(marker).evaluate(env)]
        assert len(held) == len(set(held)) and s.package in held, (s.package, python, held)
        # aiohttp and anyio (vllm-router's) need these on 3.10 alone
        assert python != "3.10" or "aiohttp" not in held or {"async-timeout", "exceptiongroup"} <= set(held), \
            (s.package, held)


@pytest.mark.parametrize("url,args", [
    ("https://pypi.site/simple", ["--index-url", "https://pypi.site/simple"]),
    ("http://127.0.0.1:3141/simple", ["--index-url", "http://127.0.0.1:3141/simple"]),  # pip trusts loopback
    ("http://localhost/simple", ["--index-url", "http://localhost/simple"]),
    ("http://pypi.site:3141/root/simple", ["--index-url", "http://pypi.site:3141/root/simple", "--trusted-host",
                                           "pypi.site:3141"]),
    ("http://10.0.0.7/simple", ["--index-url", "http://10.0.0.7/simple", "--trusted-host", "10.0.0.7"]),
    ("file:///srv/router%20wheels", ["--no-index", "--find-links", "/srv/router wheels"]),
])
def test_the_sites_index_is_one_pip_reads(url, args):
    """pip ignores a plain-HTTP index off loopback unless trusted (the lock's hashes still check each file),
    and reads a file:// folder of wheels only as --find-links."""
    rp = resolve(fleet("sglang")).routers["tiny-lab"]
    command = router.install_command(rp, url)
    assert command[command.index("--only-binary=:all:") + 1:command.index("-r")] == args


def test_the_router_venv_installs_the_catalogs_lock_with_every_hash_required():
    from modelfleet.plan.inventory import resolve as resolve_inventory

    for engine in ("vllm", "sglang"):
        rp = resolve(fleet(engine)).routers["tiny-lab"]
        s, p = router.spec(rp), router.paths(rp)
        lock = router.lock(s)
        pins = [line.split(" ")[0].split("==") for line in lock.splitlines() if line[:1].isalpha()]
        assert dict(pins)[s.package] == s.version  # the router release itself, pinned beside its dependencies
        entries = re.findall(r"^\S+==\S+(?: ;[^\\\n]*)? \\\n((?:    --hash=sha256:[0-9a-f]{64}(?: \\)?\n)+)",
                             lock, re.M)
        assert len(entries) == len(pins)  # every requirement carries its hashes
        command = router.install_command(rp)
        assert command[command.index("install"):] == [
            "install", "-q", "--disable-pip-version-check", "--require-hashes", "--only-binary=:all:", "-r",
            p["lock"], "&&", "cp", "-f", p["lock"], p["installed"]]
        assert {f["path"]: f["content"] for f in router.preview(rp)[0]}[p["lock"]] == lock
    mirror = "https://pypi.mirror.example/simple"
    command = router.install_command(rp, mirror)
    assert ["--index-url", mirror, "-r"] == command[command.index("--index-url"):][:3]
    bad = resolve_inventory([("r1", {**fleet("sglang")[0][1], "router_pip_index_url": "https://u:p@mirror/simple"})])
    assert [e for e in bad.errors if e[1] == "router_pip_index_url"] != []


def test_a_tokenspeed_pools_front_door_is_smg_too():
    revision = "a" * 40
    hosts = [(name, {**front_doors.host(address, fabric, "tokenspeed"), "model": "kimi-k3", "revision": revision,
                     "recipe": "kimi-k3-tokenspeed-b300", "hardware": "b300"})
             for name, address, fabric in (("r1", "10.0.0.1", "10.1.0.1"), ("a", "10.0.0.2", "10.1.0.2"))]
    result = resolve(hosts)
    assert result.errors == []
    rp = result.routers["kimi-k3"]
    assert router.summary(rp)["router"] == "smg 1.13.0" and router.watches_manifest(rp)
    assert json.loads(router.launcher_config(rp))["module"] == "smg.launch_router"


@pytest.mark.slow
def test_a_wheelhouse_folder_installs_through_the_products_own_command(tmp_path):
    """router_pip_index_url = file:///<folder of wheels>: the real pip, run with the command the stage sends,
    installs the locked wheel from it (as --index-url, pip looked for a PEP 503 tree there and found nothing)."""
    import hashlib
    import os
    import subprocess
    import zipfile

    house = tmp_path / "wheel house"
    house.mkdir()
    wheel = house / "mf_probe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as whl:
        whl.writestr("mf_probe/__init__.py", "")
        whl.writestr("mf_probe-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: mf-probe\nVersion: 1.0\n")
        whl.writestr("mf_probe-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr("mf_probe-1.0.dist-info/RECORD", "")
    lock = tmp_path / "lock.txt"
    lock.write_text(f"mf-probe==1.0 \\\n    --hash=sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}\n")
    rp = resolve(fleet("sglang")).routers["tiny-lab"]
    p, venv = router.paths(rp), tmp_path / "venv"
    command = [str(lock) if a == p["lock"] else str(venv / ".modelfleet-installed") if a == p["installed"]
               else a.replace(router.venv(rp), str(venv))
               for a in router.install_command(rp, "file://" + str(house).replace(" ", "%20"))]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PIP_")}, "PIP_CONFIG_FILE": os.devnull}
    done = subprocess.run(" ".join(a if a == "&&" else shlex.quote(a) for a in command), shell=True, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert list(venv.glob("lib/python*/site-packages/mf_probe/__init__.py"))
    assert (venv / ".modelfleet-installed").read_text() == lock.read_text()
