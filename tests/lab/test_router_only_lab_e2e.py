"""A host that runs only the front door, on the lab: the first lab host written `router_only = True` (no board, no
service) runs sglang-router in front of an SGLang replica (engine double) on the second, as `deploys/serve.py`
converges it. A client on the replica's host gets the model through the front door with the key and a 401 without;
the router host holds the router's unit and files and nothing of an engine host (no engine unit or container, no
checkpoint, no fetch tool); `show` names the endpoint clients use; a second converge retires nothing there."""

import json

import pytest
from click.testing import CliRunner

from lab import NET, ssh
from lab import scenario as lab_scenario
from modelfleet.cli import main
from modelfleet.plan import router
from modelfleet.plan.inventory import open_inventory
from tests.lab.test_front_door_lab_e2e import KEY, _curl, converge

pytestmark = pytest.mark.lab

PORT = 18810 + 20 * NET  # beside test_front_door_lab_e2e's port, apart from other labs'


@pytest.fixture(scope="module")
def gateway(lab_hosts):
    """(router host, replica host, first and second converge, the resolved inventory, `show --json` of the router
    host), the router host written router_only."""
    with lab_scenario.applied(only=[s["name"] for s in lab_hosts[:2]], engine="sglang", api_key_env="LAB_API_KEY",
                              router=lab_hosts[0]["name"], router_port=PORT, router_only=True):
        resolved = open_inventory("inventories/lab.py", offline=True)
        plan = resolved.hosts[lab_hosts[0]["name"]]
        # The router host as it arrives: what earlier tests of the session left on this lab host goes first (the
        # test below asserts on what the run itself writes there).
        ssh(lab_hosts[0], f"rm -rf {plan.model_root}/tiny-lab /opt/modelfleet/bin/modelfleet_fetch.py "
                          f"/opt/modelfleet/bin/nccl_check.py {plan.config_dir}/hf-token")
        runs = converge(), converge()
        shown = CliRunner().invoke(main, ["show", "--json", "inventories/lab.py", lab_hosts[0]["name"]],
                                   env={"LAB_API_KEY": KEY})
    assert resolved.errors == [], resolved.errors
    yield lab_hosts[0], lab_hosts[1], *runs, resolved, shown


def test_the_router_only_host_serves_the_model_through_its_front_door_and_runs_no_engine(gateway):
    router_host, replica, first, second, resolved, shown = gateway
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-3000:]
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-3000:]
    plan = resolved.hosts[router_host["name"]]
    assert plan.services == () and plan.hardware.gpus_per_node == 0
    rp = resolved.routers["tiny-lab"]
    assert rp.host == router_host["name"] and [w.host for w in rp.workers] == [replica["name"]]
    front = f"http://{router_host['address']}:{PORT}"
    chat = json.dumps({"model": "tiny-lab", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    status, body = _curl(replica, f"-X POST -H 'Authorization: Bearer {KEY}' -H 'Content-Type: application/json' "
                                  f"-d '{chat}' {front}/v1/chat/completions")
    assert status == "200" and json.loads(body)["choices"][0]["message"]["role"] == "assistant", (status, body[:300])
    status, _ = _curl(replica, f"-X POST -H 'Content-Type: application/json' -d '{chat}' {front}/v1/chat/completions")
    assert status == "401"
    # The router host: the router's unit active, no engine unit, container, checkpoint or fetch tool.
    units = ssh(router_host, "systemctl list-units --all --plain --no-legend 'modelfleet-*' | awk '{print $1}'")
    assert units.stdout.split() == [rp.unit_name], units.stdout
    assert ssh(router_host, f"systemctl is-active {rp.unit_name}").stdout.strip() == "active"
    containers = ssh(router_host, "docker ps -a --format '{{.Names}}' 2>/dev/null | grep -c . || true")
    assert containers.stdout.strip() in ("", "0") or router_host["name"] not in containers.stdout
    for path in (f"{plan.model_root}/tiny-lab", "/opt/modelfleet/bin/modelfleet_fetch.py",
                 "/opt/modelfleet/bin/nccl_check.py", f"{plan.config_dir}/hf-token"):
        assert ssh(router_host, f"test -e {path} && echo there || echo none").stdout.strip() == "none", path
    # The second converge retired nothing on the router host (its units are the ones its plan names).
    assert "modelfleet: retiring" not in second.stdout + second.stderr
    assert KEY not in first.stdout + first.stderr + second.stdout + second.stderr
    assert router.listed(ssh(router_host, f"echo workers=$({router.list_command(rp)})").stdout.strip()
                         .partition("=")[2]) is not None


def test_show_names_the_front_door_the_router_only_host_runs(gateway):
    router_host, _, _, _, resolved, shown = gateway
    assert shown.exit_code == 0, shown.output
    [row] = [r["value"] for r in json.loads(shown.output) if r["key"].startswith("endpoint")]
    assert row["url"] == f"http://{router_host['address']}:{PORT}/v1" and row["tls"] is False
    assert row["port"] == PORT and row["bind_address"] == router_host["address"]
