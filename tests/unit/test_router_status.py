"""`modelfleet status` with a front door: the router host's row lists what its router says of the replicas,
and each routed replica says whether it is in the router (listed and healthy), out of it (not listed), or
unhealthy (listed, and the router's health check took it out)."""

from pathlib import Path

import pytest

from modelfleet.fleet import status as fleet_status
from modelfleet.plan.inventory import resolve

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "router"
# The replica ids sglang-router 0.3.2 answered with; the inventory below puts its replicas at those URLs.
WORKERS = (FIXTURES / "sglang-router-0.3.2-workers.json.txt").read_text().split("# ---\n", 1)[1].strip()


def replica(pool: str, port: int) -> dict:
    return {"pool": pool, "model": "tiny-lab", "engine": "sglang", "recipe": "tiny-lab-sglang", "port": port,
            "router": "r1", "api_key_env": "MF_ROUTER_KEY", "router_bind_address": "127.0.0.1"}


@pytest.fixture
def plans(monkeypatch):
    monkeypatch.setenv("MF_ROUTER_KEY", "status-test-key-0123")
    result = resolve([
        ("r1", {"hardware": "lab-cpu", "ssh_hostname": "10.0.0.1", "services": [replica("p1", 18011),
                                                                                 replica("p2", 18012)]}),
        ("a", {"hardware": "lab-cpu", "ssh_hostname": "10.0.0.2", "fabric_address": "10.1.0.2",
               **replica("p3", 18013)})])
    assert result.errors == []
    return [result.hosts["r1"], result.hosts["a"]]


def answers(plans, workers: str) -> dict:
    """What each host's status script prints: its units active, and (on r1) the router's list."""
    out = {}
    for plan in plans:
        text = "".join(f"@@modelfleet-status service {s.pool}\nActiveState=active\nSubState=running\nhealth=200\n"
                       for s in plan.services)
        text += "".join(f"@@modelfleet-status router {rp.name}\nActiveState=active\nSubState=running\n"
                        f"workers={workers}\n" for rp in plan.routers)
        out[plan.name] = (0, text + "@@modelfleet-status host\n", "")
    return out


def test_status_says_which_replicas_the_router_has(plans, monkeypatch):
    assert "router tiny-lab" in fleet_status.status_script(plans[0])
    assert "router" not in fleet_status.status_script(plans[1])
    monkeypatch.setattr(fleet_status, "on_hosts", lambda plans_, script: answers(plans_, WORKERS))
    rows = fleet_status.status(plans)
    assert rows[0]["routers"] == [{"name": "tiny-lab", "unit": "modelfleet-router-tiny-lab.service",
                                   "front_door": "http://127.0.0.1:8800", "tls": False, "state": "active/running",
                                   "workers": {"http://127.0.0.1:18011": True, "http://127.0.0.1:18012": True}}]
    # p3 on host a is in the inventory but not in the router's list.
    assert [(s["pool"], s["router"]) for row in rows for s in row["services"]] == [
        ("p1", "in"), ("p2", "in"), ("p3", "out")]
    table = fleet_status.status_table(rows)
    assert "door tiny-lab" in table and "http://127.0.0.1:8800 (plain HTTP; 2/2 replicas healthy)" in table


def test_a_replica_the_health_check_took_out_is_unhealthy(plans, monkeypatch):
    failed = WORKERS.replace('"url":"http://127.0.0.1:18012","model_id":"unknown","priority":50,"cost":1.0,'
                             '"worker_type":"regular","is_healthy":true',
                             '"url":"http://127.0.0.1:18012","model_id":"unknown","priority":50,"cost":1.0,'
                             '"worker_type":"regular","is_healthy":false')
    assert failed != WORKERS
    monkeypatch.setattr(fleet_status, "on_hosts", lambda plans_, script: answers(plans_, failed))
    rows = fleet_status.status(plans)
    assert [s["router"] for s in rows[0]["services"]] == ["in", "unhealthy"]
    table = fleet_status.status_table(rows)
    assert "(plain HTTP; 1/2 replicas healthy)" in table
    # Each replica of the front door under it, as its router lists it.
    replicas = [line.split()[-2:] for line in table.splitlines() if line.lstrip().startswith("replica ")]
    assert replicas == [["http://127.0.0.1:18011", "(listed)"], ["http://127.0.0.1:18012", "(unhealthy)"]]
    assert [line.split()[6] for line in table.splitlines() if " p2 " in line] == ["unhealthy"]


def test_a_router_that_does_not_answer_leaves_the_replicas_unknown(plans, monkeypatch):
    monkeypatch.setattr(fleet_status, "on_hosts", lambda plans_, script: answers(plans_, ""))
    rows = fleet_status.status(plans)
    assert rows[0]["routers"][0]["workers"] is None
    assert {s["router"] for row in rows for s in row["services"]} == {None}
    assert "(plain HTTP; no answer)" in fleet_status.status_table(rows)
