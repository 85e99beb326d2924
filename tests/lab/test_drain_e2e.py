"""`modelfleet drain` and `undrain` on the lab: two SGLang replicas (engine doubles) behind the first host's front
door, as serve.py converges them. Draining the second takes its replica out of the router's list, then stops and
disables its engine; its unit file, env file and checkpoint stay, and the front door still answers through the
first. Undrain starts it again and the router lists it again. Draining both is refused without --allow-outage,
before anything is touched."""

import json

import pytest

from lab import NET, ssh
from lab import scenario as lab_scenario
from modelfleet import REPO_ROOT
from modelfleet.base.commands import run_modelfleet
from modelfleet.plan import router
from modelfleet.plan.inventory import open_inventory
from tests.lab.test_front_door_lab_e2e import KEY, _curl, converge

pytestmark = pytest.mark.lab

PORT = 18804 + 20 * NET  # apart from the other front door tests' ports and from other labs'


def listed(router_host, rp) -> dict:
    said = ssh(router_host, f"echo workers=$({router.list_command(rp)})").stdout.strip()
    return router.listed(said.partition("=")[2]) or {}


def unit_state(spec, unit: str) -> tuple[str, str, str]:
    said = ssh(spec, f"systemctl is-active {unit}; systemctl is-enabled {unit}; "
                     f"test -e /etc/systemd/system/{unit} && echo file || echo none").stdout.split()
    return tuple(said)


def modelfleet(*args):
    return run_modelfleet(*args, cwd=REPO_ROOT, env={"LAB_API_KEY": KEY}, timeout=600)


def test_drain_takes_a_replica_out_and_stops_it_and_undrain_brings_it_back(lab_hosts):
    router_host, other = lab_hosts[0], lab_hosts[1]
    with lab_scenario.applied(only=[router_host["name"], other["name"]], engine="sglang", api_key_env="LAB_API_KEY",
                              router=router_host["name"], router_port=PORT):
        first = converge()
        assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-3000:]
        resolved = open_inventory("inventories/lab.py", offline=True)
        rp = resolved.routers["tiny-lab"]
        plan = resolved.hosts[other["name"]]
        svc = plan.services[0]
        urls = {w.host: w.url for w in rp.workers}
        assert set(listed(router_host, rp)) == set(urls.values())

        both = modelfleet("drain", "inventories/lab.py", router_host["name"], other["name"])
        assert both.returncode == 2 and "leaves tiny-lab with no endpoint" in both.stderr, both.stderr
        assert set(listed(router_host, rp)) == set(urls.values())

        drained = modelfleet("drain", "inventories/lab.py", other["name"], "--json")
        assert drained.returncode == 0, drained.stdout + drained.stderr
        assert json.loads(drained.stdout)["ok"] is True
        assert set(listed(router_host, rp)) == {urls[router_host["name"]]}
        active, enabled, file = unit_state(other, svc.unit_name)
        assert (active, file) == ("inactive", "file") and enabled == "disabled", (active, enabled, file)
        kept = ssh(other, f"test -e {svc.env_file} && test -d {plan.model_root}/tiny-lab && echo kept").stdout
        assert kept.strip() == "kept"
        chat = json.dumps({"model": "tiny-lab", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        for _ in range(4):  # every request lands on the replica left in
            status, body = _curl(router_host, f"-X POST -H 'Authorization: Bearer {KEY}' -H 'Content-Type: "
                                              f"application/json' -d '{chat}' http://{router_host['address']}:{PORT}"
                                              "/v1/chat/completions")
            assert status == "200", (status, body[:300])

        back = modelfleet("undrain", "inventories/lab.py", other["name"])
        assert back.returncode == 0, back.stdout + back.stderr
        assert unit_state(other, svc.unit_name) == ("active", "enabled", "file")
        assert set(listed(router_host, rp)) == set(urls.values())
