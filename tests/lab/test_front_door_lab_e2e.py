"""The front door on the lab, as `deploys/serve.py` converges it (the router stage on a real systemd host: the
router's wheel from PyPI in a venv, its launcher, unit and keys): two SGLang replicas (engine doubles) behind
sglang-router on the first host. Then an attacker on the router host (a local process of another user, and one
that holds the clients' key) tries to register its own worker: what it got is asserted, and that the router never
lists it. (vLLM's front door needs nginx, which the lab's apt archive does not carry: tests/router runs it.)"""

import base64
import json
import secrets

import pytest
from click.testing import CliRunner

from lab import NET, ssh
from modelfleet.base.commands import run_pyinfra
from modelfleet.cli import main
from modelfleet.plan import router
from modelfleet.plan.inventory import open_inventory

pytestmark = pytest.mark.lab

KEY = "lab-door-" + secrets.token_hex(12)
PORT = 18800 + 20 * NET  # apart from other labs' on this machine's shared loopback


def converge():
    return run_pyinfra("inventories/lab.py", "deploys/serve.py", env={"LAB_API_KEY": KEY}, timeout=600)


@pytest.fixture(scope="module")
def door(lab_hosts):
    from lab import scenario as lab_scenario

    router_host, other = lab_hosts[0], lab_hosts[1]
    fields = dict(only=[router_host["name"], other["name"]], engine="sglang", api_key_env="LAB_API_KEY",
                  router=router_host["name"], router_port=PORT)
    with lab_scenario.applied(**fields):
        first = converge()
        second = converge()
        resolved = open_inventory("inventories/lab.py", offline=True)
        preview = CliRunner().invoke(main, ["render", "--json", "inventories/lab.py", router_host["name"]],
                                     env={"LAB_API_KEY": KEY})
    assert resolved.errors == [], resolved.errors
    assert preview.exit_code == 0, preview.output
    yield router_host, other, first, second, resolved.routers["tiny-lab"], json.loads(preview.output)


def _curl(spec, args: str, user: str = "root") -> tuple[str, str]:
    """(HTTP status, body) of a curl run on a lab host, as `user`."""
    run = f"runuser -u {user} -- " if user != "root" else ""
    got = ssh(spec, f"{run}curl -s -m 10 -o /tmp/door-body -w '%{{http_code}}' {args}; echo; cat /tmp/door-body; "
              "rm -f /tmp/door-body")
    status, _, body = got.stdout.partition("\n")
    return status.strip(), body


def test_the_front_door_converges_and_then_changes_nothing(door):
    _, _, first, second, _, _ = door
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-3000:]
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-3000:]
    assert KEY not in first.stdout + first.stderr + second.stdout + second.stderr
    assert "Worker API key of router" in first.stdout + first.stderr  # made on the host, once
    assert "Worker API key of router" not in second.stdout + second.stderr


def test_a_local_process_cannot_register_a_worker_with_the_router(door):
    router_host, other, first, _, rp, _ = door
    assert first.returncode == 0
    front = f"http://{router_host['address']}:{PORT}"
    chat = json.dumps({"model": "tiny-lab", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    # A client on another lab host gets the model with the key.
    status, body = _curl(other, f"-X POST -H 'Authorization: Bearer {KEY}' -H 'Content-Type: application/json' "
                                f"-d '{chat}' {front}/v1/chat/completions")
    assert status == "200" and json.loads(body)["choices"][0]["message"]["role"] == "assistant", (status, body[:300])
    attacker = json.dumps({"url": f"http://{other['address']}:9", "model_id": "tiny-lab"})
    # On the router host: a process of another user, with no key and with the clients' key (it is a client too).
    tries = {
        "nobody, no key": _curl(router_host, f"-X POST -H 'Content-Type: application/json' -d '{attacker}' "
                                             f"{front}/workers", user="nobody"),
        "nobody, client key": _curl(router_host, f"-X POST -H 'Authorization: Bearer {KEY}' -H 'Content-Type: "
                                                 f"application/json' -d '{attacker}' {front}/workers", user="nobody"),
        "another lab host, client key": _curl(other, f"-X POST -H 'Authorization: Bearer {KEY}' -H 'Content-Type: "
                                                     f"application/json' -d '{attacker}' {front}/workers"),
    }
    assert {who: status for who, (status, _) in tries.items()} == dict.fromkeys(tries, "401"), tries
    # The worker API's key is the host's own: another user cannot read it.
    admin = router.paths(rp)["admin"]
    readable = ssh(router_host, f"runuser -u nobody -- cat {admin}")
    assert readable.returncode != 0 and "Permission denied" in readable.stderr
    assert ssh(router_host, f"stat -c %a {admin}").stdout.strip() == "600"
    listed = router.parse_workers(ssh(router_host, router.list_command(rp)).stdout)
    assert listed is not None and f"http://{other['address']}:9" not in listed
    assert set(listed) == {w.url for w in rp.workers}


def test_the_router_hosts_files_previewed_by_render_are_the_ones_the_run_wrote(door):
    router_host, _, first, _, rp, shown_json = door
    assert first.returncode == 0
    ours = {f["path"] for f in router.preview(rp)[0]}
    files = {f["path"]: f for f in shown_json["files"] if f["path"] in ours}
    assert ours == set(files) and {router.paths(rp)["unit"], router.LAUNCHER} <= ours
    for path, shown in files.items():
        raw = base64.b64decode(ssh(router_host, f"base64 -w0 {path}").stdout)
        assert ssh(router_host, f"stat -c %a {path}").stdout.strip() == shown["mode"].lstrip("0"), path
        if "********" in shown["content"]:  # a secret, masked in the preview: the run wrote the key there
            assert raw.decode().strip() == KEY and KEY not in json.dumps(shown_json), path
        else:
            assert raw == shown["content"].encode(), path  # byte for byte
    assert any("plain HTTP" in note for note in shown_json["notes"])
