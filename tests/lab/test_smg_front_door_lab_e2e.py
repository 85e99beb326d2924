"""SGLang's front door on smg, the real gateway from its PyPI wheel, as `deploys/serve.py` converges it on the lab:
two SGLang replicas (engine doubles) behind smg on the first host. One converge after another, a replica leaves
(its host leaves the inventory) and joins again: smg re-reads the manifest modelfleet rewrites and is never
restarted; the model's key rotates: the old one gets 401, the new one the model; the front door leaves the
inventory: the next converge retires the router's unit and its files."""

import json
import secrets

import pytest

from lab import NET, ssh
from lab import scenario as lab_scenario
from modelfleet.base.commands import run_pyinfra
from modelfleet.plan import router
from modelfleet.plan.inventory import open_inventory

pytestmark = pytest.mark.lab

KEYS = ["lab-smg-" + secrets.token_hex(12), "lab-smg-" + secrets.token_hex(12)]
PORT = 18803 + 20 * NET  # apart from the other front door tests' ports and other labs'


def converge(key: str):
    return run_pyinfra("inventories/lab.py", "deploys/serve.py", env={"LAB_API_KEY": key}, timeout=600)


def _state(router_host, rp) -> dict:
    """The router's unit (its main process), its list of replicas and the manifest it watches, on its host."""
    pid = ssh(router_host, f"systemctl show -p MainPID --value {rp.unit_name}").stdout.strip()
    listed = router.parse_workers(ssh(router_host, router.list_command(rp)).stdout)
    manifest = ssh(router_host, f"cat {router.live_manifest(rp)}").stdout
    return {"pid": pid, "listed": set(listed or {}), "manifest": manifest}


def _chat(client, front: str, key: str) -> tuple[str, str]:
    body = json.dumps({"model": "tiny-lab", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    got = ssh(client, f"curl -s -m 20 -o /tmp/smg-body -w '%{{http_code}}' -X POST -H 'Authorization: Bearer {key}' "
                      f"-H 'Content-Type: application/json' -d '{body}' {front}/v1/chat/completions; echo; "
                      "cat /tmp/smg-body; rm -f /tmp/smg-body")
    status, _, text = got.stdout.partition("\n")
    return status.strip(), text


@pytest.fixture(scope="module")
def story(lab_hosts):
    router_host, other = lab_hosts[0], lab_hosts[1]
    both = dict(engine="sglang", api_key_env="LAB_API_KEY", router=router_host["name"], router_port=PORT)
    out = {}
    with lab_scenario.applied(only=[router_host["name"], other["name"]], **both):
        out["first"] = converge(KEYS[0])
        rp = open_inventory("inventories/lab.py", offline=True).routers["tiny-lab"]
        out["rp"], out["start"] = rp, _state(router_host, rp)
    with lab_scenario.applied(only=[router_host["name"]], **both):
        out["leave"] = converge(KEYS[0])
        out["left"] = _state(router_host, rp)
        out["left_chat"] = _chat(other, rp.base_url, KEYS[0])
    with lab_scenario.applied(only=[router_host["name"], other["name"]], **both):
        out["join"] = converge(KEYS[0])
        out["joined"] = _state(router_host, rp)
        out["rotate"] = converge(KEYS[1])
        out["rotated"] = _state(router_host, rp)
        out["chats"] = {key: _chat(other, rp.base_url, key) for key in KEYS}
    # The router host alone, its front door gone from the inventory.
    with lab_scenario.applied(only=[router_host["name"]], engine="sglang", api_key_env="LAB_API_KEY"):
        out["retire"] = converge(KEYS[1])
    yield router_host, other, out


def _ok(run) -> bool:
    return run.returncode == 0 and not any(key in run.stdout + run.stderr for key in KEYS)


def test_a_replica_leaves_and_joins_the_running_smg_without_a_restart(story):
    router_host, other, out = story
    assert _ok(out["first"]), out["first"].stdout[-4000:] + out["first"].stderr[-3000:]
    rp, start = out["rp"], out["start"]
    assert router.spec(rp).package == "smg"
    gone = next(w.url for w in rp.workers if w.host == other["name"])
    assert start["listed"] == {w.url for w in rp.workers} and gone in start["manifest"]
    assert _ok(out["leave"]), out["leave"].stdout[-4000:] + out["leave"].stderr[-3000:]
    assert out["left"]["pid"] == start["pid"], "the router restarted when a replica left"
    assert out["left"]["listed"] == start["listed"] - {gone} and gone not in out["left"]["manifest"]
    status, body = out["left_chat"]
    assert status == "200" and json.loads(body)["choices"][0]["message"]["role"] == "assistant", (status, body[:300])
    assert _ok(out["join"]), out["join"].stdout[-4000:] + out["join"].stderr[-3000:]
    assert out["joined"]["pid"] == start["pid"], "the router restarted when a replica joined"
    assert out["joined"]["listed"] == start["listed"] and gone in out["joined"]["manifest"]


def test_the_models_key_rotates_through_smg(story):
    _, _, out = story
    assert _ok(out["rotate"]), out["rotate"].stdout[-4000:] + out["rotate"].stderr[-3000:]
    old, new = out["chats"][KEYS[0]], out["chats"][KEYS[1]]
    assert old[0] == "401", old
    assert new[0] == "200" and json.loads(new[1])["choices"][0]["message"]["role"] == "assistant", new
    assert out["rotated"]["listed"] == out["joined"]["listed"]


def test_a_front_door_the_inventory_no_longer_names_is_retired(story):
    router_host, _, out = story
    run, rp = out["retire"], out["rp"]
    assert _ok(run), run.stdout[-4000:] + run.stderr[-3000:]
    assert f"modelfleet: retiring {rp.unit_name}" in run.stdout + run.stderr
    gone = ssh(router_host, f"systemctl is-active {rp.unit_name}; test -e {router.paths(rp)['unit']} && echo unit; "
                            f"ls {' '.join(router.paths(rp)[k] for k in ('config', 'workers', 'key', 'admin'))} "
                            f"{router.runtime_dir(rp)} 2>/dev/null; true")
    assert gone.stdout.split() in (["inactive"], ["unknown"], ["failed"]), gone.stdout
    assert ssh(router_host, f"curl -s -m 5 -o /dev/null -w '%{{http_code}}' {rp.base_url}/health").stdout in ("000", "")
