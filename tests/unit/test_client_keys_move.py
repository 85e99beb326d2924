"""Moving a front door from the one shared key (the model's `api_key_env`, which clients held) to clients' keys
of their own without a flag day (docs/front-door.md): `router_client_keys_env` may list `api_key_env` itself
while clients move, and the key file the run writes takes exactly the keys of each step. The real nginx and
router do the same steps under load: tests/router/test_key_rotation_e2e.py."""

import re

import pytest

from modelfleet.plan import router
from modelfleet.plan.inventory import resolve
from tests.helpers.front_doors import fleet

SHARED, CLIENT = "shared-model-key-0001", "client-own-key-0002"


@pytest.fixture(autouse=True)
def env(monkeypatch):
    monkeypatch.setenv("MF_ROUTER_KEY", SHARED)
    monkeypatch.setenv("MF_CLIENT_A", CLIENT)


def accepted(conf: str, key: str) -> bool:
    """Whether nginx's map in the key file sets $modelfleet_authorized to 1 for `Authorization: Bearer key`."""
    block = conf.split("map $http_authorization $modelfleet_authorized {", 1)[1].split("}", 1)[0]
    return any(re.fullmatch(m.group(1)[1:], f"Bearer {key}") for m in re.finditer(r'"(~[^"]+)" 1;', block))


def step(*names: str):
    resolved = resolve(fleet("vllm", **({"router_client_keys_env": list(names)} if names else {})))
    assert resolved.errors == [], resolved.errors
    rp = resolved.routers["tiny-lab"]
    conf = router.proxy_key_file(rp)
    return resolved, conf


def test_the_shared_key_stays_accepted_beside_the_clients_own_until_taken_out():
    before, conf = step()
    assert accepted(conf, SHARED) and not accepted(conf, CLIENT)
    during, conf = step("MF_ROUTER_KEY", "MF_CLIENT_A")  # both taken; the replicas get the shared key
    assert accepted(conf, SHARED) and accepted(conf, CLIENT) and not accepted(conf, "nope-0123456789")
    assert f'default "Bearer {SHARED}";' in conf
    assert [(w, f) for w, f, _ in during.warnings if f == "router_client_keys_env"] == [
        ("router tiny-lab", "router_client_keys_env")]
    assert "take it out once they have" in [m for _, f, m in during.warnings if f == "router_client_keys_env"][0]
    after, conf = step("MF_CLIENT_A")  # the shared key gets 401 from here on
    assert accepted(conf, CLIENT) and not accepted(conf, SHARED)
    assert not [w for w in after.warnings if w[1] == "router_client_keys_env"]


def test_another_variable_holding_the_shared_key_is_still_refused_and_says_the_way(monkeypatch):
    monkeypatch.setenv("MF_CLIENT_A", SHARED)
    errors = resolve(fleet("vllm", router_client_keys_env=["MF_CLIENT_A"])).errors
    assert [f for _, f, _ in errors] == ["router_client_keys_env"]
    assert "list MF_ROUTER_KEY itself, then take it out" in errors[0][2] and SHARED not in errors[0][2]
