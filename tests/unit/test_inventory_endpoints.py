"""`show HOST`'s endpoint rows: the front doors a host runs (the very entries `validate --json` lists) and the
services it serves, each with port, bind address, router, the URL clients use and TLS or plain HTTP."""

import json

import pytest
from click.testing import CliRunner

from modelfleet.cli import main
from modelfleet.plan.inventory import endpoints, resolve

KEY = "endpoint-rows-key-0123456"


def replica(address: str, **extra) -> dict:
    return {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "sglang", "recipe": "tiny-lab-sglang",
            "ssh_hostname": address, "router": "gw", "api_key_env": "MF_EP_KEY", **extra}


FLEET = [("gw", {"router_only": True, "ssh_hostname": "10.0.0.9"}), ("a", replica("10.0.0.2")),
         ("b", replica("10.0.0.3")),
         ("solo", {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm",
                   "ssh_hostname": "10.0.0.4", "served_name": "direct", "port": 30100})]


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("MF_EP_KEY", KEY)


def test_the_router_host_has_its_front_door_row_and_the_replicas_theirs():
    result = resolve(FLEET)
    assert result.errors == []
    [door] = endpoints.rows(result, "gw")
    assert (door["endpoint"], door["bind_address"], door["port"], door["url"], door["tls"]) == (
        "front door tiny-lab", "10.0.0.9", 8800, "http://10.0.0.9:8800/v1", False)
    assert door["router"] == "smg 1.13.0"
    assert [r["url"] for r in door["replicas"]] == ["http://10.0.0.2:30000", "http://10.0.0.3:30000"]
    [a] = endpoints.rows(result, "a")
    assert a == {"endpoint": "pool a", "bind_address": "10.0.0.2", "port": 30000, "router": door["router"],
                 "front_door": "tiny-lab on gw", "url": "http://10.0.0.9:8800/v1", "tls": False,
                 "replica_url": "http://10.0.0.2:30000"}
    [solo] = endpoints.rows(result, "solo")
    assert (solo["front_door"], solo["url"], solo["port"]) == (None, "http://127.0.0.1:30100/v1", 30100)
    assert endpoints.lines([door])[0].startswith("front door tiny-lab  listens 10.0.0.9:8800  router smg 1.13.0")
    assert "clients use http://10.0.0.9:8800/v1 (plain HTTP)" in endpoints.lines([a])[0]


def test_a_tls_front_door_says_https_on_both_ends():
    fleet = [(n, {**d, "router_tls_cert": "/c.pem", "router_tls_key": "/k.pem"} if n in "ab" else d) for n, d in FLEET]
    result = resolve(fleet, offline=True)
    assert result.errors == []
    [door], [a] = endpoints.rows(result, "gw"), endpoints.rows(result, "a")
    assert door["url"] == a["url"] == "https://10.0.0.9:8800/v1" and door["tls"] and a["tls"]
    assert "(TLS)" in endpoints.lines([a])[0]


def test_show_prints_the_rows_and_its_json_holds_validates_front_door(tmp_path):
    inv = tmp_path / "inv.py"
    inv.write_text(f"hosts = {FLEET!r}\n")
    shown = CliRunner().invoke(main, ["show", "--json", str(inv), "gw"])
    assert shown.exit_code == 0, shown.output
    [row] = [r for r in json.loads(shown.output) if r["key"].startswith("endpoint")]
    validated = CliRunner().invoke(main, ["validate", "--json", str(inv)])
    [door] = json.loads(validated.output)["front_doors"]
    assert row["value"] == {"endpoint": "front door tiny-lab", **door}
    text = CliRunner().invoke(main, ["show", str(inv), "a"]).output
    assert "endpoint: pool a  listens 10.0.0.2:30000  replica behind front door tiny-lab on gw" in text
