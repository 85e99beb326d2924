"""Rotating the clients' key behind the front door (README's task) with the real vllm-router behind Debian's
nginx, three vLLM engine doubles behind it, and clients sending chat requests throughout: the front door accepts
the clients' keys (router_client_keys_env) and sends the replicas a key of its own, so adding the new key,
moving the clients and removing the old one is two nginx reloads, with no request refused for a key a client
holds at that moment, and no replica ever seeing a client's key (its double would refuse it)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from modelfleet.plan import router
from modelfleet.plan.inventory import resolve
from modelfleet.plan.inventory.plan import RouterPlan, Worker
from tests.helpers.front_doors import fleet
from tests.router import front_door as door
from tests.router.front_door import KEY, SERVED, http

pytestmark = pytest.mark.slow
OLD, NEW = "client-key-old-0001", "client-key-new-0002"


class RotatingClients(door.Clients):
    """Client threads sending chats with whichever key `self.key` holds now; every answer is kept with its key."""

    def __init__(self, base_url: str, key: str):
        super().__init__(base_url)
        self.key, self.answers = key, []

    def _run(self):
        body = {"model": SERVED, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}
        while not self.stopping.is_set():
            key = self.key
            try:
                status = http("POST", f"{self.base_url}/v1/chat/completions", body, key)[0]
            except OSError as error:
                status = f"{type(error).__name__}: {error}"
            with self.lock:
                self.answers.append((key, status))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_clients_key_rotates_with_no_refused_request(engine, tmp_path, monkeypatch):
    monkeypatch.setenv("MF_MODEL_KEY", KEY)
    monkeypatch.setenv("MF_CLIENT_OLD", OLD)
    monkeypatch.setenv("MF_CLIENT_NEW", NEW)
    replicas = [door.Replica(engine, tmp_path, i) for i in range(3)]
    plain = RouterPlan(name=SERVED, host="local", engine_name=engine, served_name=SERVED, bind_address="127.0.0.1",
                       port=door.free_base_port(3), policy="round_robin", api_key_env="MF_MODEL_KEY",
                       config_dir=str(tmp_path), workers=tuple(Worker(f"r{i}", "local", r.url)
                                                               for i, r in enumerate(replicas)),
                       client_keys_env=("MF_CLIENT_OLD",))
    procs = door.start_front_door(plain, tmp_path)
    nginx = procs[1]
    runtime = str(tmp_path / "door")

    def converge(*names: str) -> RouterPlan:
        """What a converge with router_client_keys_env = names writes, then `systemctl reload` (nginx -t, HUP)."""
        rp = RouterPlan(**{**plain.__dict__, "client_keys_env": names})
        p = router.paths(rp)
        Path(p["proxy_key"]).write_text(router.proxy_key_conf(router.client_keys(rp), KEY))
        Path(p["proxy"]).write_text(router.render_proxy(rp, runtime=runtime))
        door.sh(f"{door.nginx_binary()} -t -q -e stderr -p {runtime} -c {p['proxy']}")
        nginx.send_signal(signal.SIGHUP)
        time.sleep(1.5)  # new workers take over; the old ones finish their requests
        return rp

    try:
        converge("MF_CLIENT_OLD")
        front = plain.base_url
        assert http("POST", f"{front}/v1/chat/completions", {"model": SERVED, "messages": [
            {"role": "user", "content": "hi"}]}, OLD)[0] == 200
        with RotatingClients(front, OLD) as clients:
            time.sleep(2)
            converge("MF_CLIENT_OLD", "MF_CLIENT_NEW")  # add the new key
            time.sleep(2)
            clients.key = NEW  # move the clients
            time.sleep(2)
            converge("MF_CLIENT_NEW")  # remove the old key
            time.sleep(2)
        by_key = {k: [s for key, s in clients.answers if key == k] for k in (OLD, NEW)}
        refused = [(k, s) for k, s in clients.answers if s != 200]
        print(f"\nkey rotation: {len(by_key[OLD])} requests with the old key, {len(by_key[NEW])} with the new, "
              f"{len(refused)} not answered 200: {refused[:5]}")
        assert len(by_key[OLD]) >= 20 and len(by_key[NEW]) >= 20
        assert refused == []
        chat = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}]}
        # After: the old key, and the replicas' own key, are refused at the front door; the new one is taken.
        assert http("POST", f"{front}/v1/chat/completions", chat, OLD)[0] == 401
        assert http("POST", f"{front}/v1/chat/completions", chat, KEY)[0] == 401
        assert http("POST", f"{front}/v1/chat/completions", chat, NEW)[0] == 200
        assert nginx.poll() is None and procs[0].poll() is None
    finally:
        door.stop_all(procs)
        for replica in replicas:
            replica.stop()


def test_moving_from_the_shared_key_to_client_keys_refuses_no_request(tmp_path, monkeypatch):
    """From the one shared key (api_key_env, which clients hold) to clients' own keys, vLLM's front door (nginx
    already): list api_key_env beside the new key, move the clients, take it out. No request refused."""
    monkeypatch.setenv("MF_ROUTER_KEY", KEY)  # tests.helpers.front_doors' api_key_env
    monkeypatch.setenv("MF_CLIENT_NEW", NEW)
    replicas = [door.Replica("vllm", tmp_path, i) for i in range(2)]
    shared = RouterPlan(name=SERVED, host="local", engine_name="vllm", served_name=SERVED, bind_address="127.0.0.1",
                        port=door.free_base_port(3), policy="round_robin", api_key_env="MF_ROUTER_KEY",
                        config_dir=str(tmp_path), workers=tuple(Worker(f"r{i}", "local", r.url)
                                                                for i, r in enumerate(replicas)))
    procs = door.start_front_door(shared, tmp_path)
    nginx, runtime = procs[1], str(tmp_path / "door")

    def converge(*names: str) -> None:
        """What a converge with router_client_keys_env = names writes (the stage's own call), then a reload;
        `validate` takes each step first."""
        assert resolve(fleet("vllm", router_client_keys_env=list(names))).errors == []
        rp = RouterPlan(**{**shared.__dict__, "client_keys_env": names})
        p = router.paths(rp)
        Path(p["proxy_key"]).write_text(router.proxy_key_file(rp))
        Path(p["proxy"]).write_text(router.render_proxy(rp, runtime=runtime))
        door.sh(f"{door.nginx_binary()} -t -q -e stderr -p {runtime} -c {p['proxy']}")
        nginx.send_signal(signal.SIGHUP)
        time.sleep(1.5)

    chat = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}]}
    front = shared.base_url
    try:
        assert http("POST", f"{front}/v1/chat/completions", chat, NEW)[0] == 401  # before: the shared key only
        with RotatingClients(front, KEY) as clients:
            time.sleep(2)
            converge("MF_ROUTER_KEY", "MF_CLIENT_NEW")  # both taken; replicas get the shared key from the door
            time.sleep(2)
            clients.key = NEW
            time.sleep(2)
            converge("MF_CLIENT_NEW")
            time.sleep(2)
        by_key = {k: [s for key, s in clients.answers if key == k] for k in (KEY, NEW)}
        refused = [(k, s) for k, s in clients.answers if s != 200]
        print(f"\nshared -> client keys: {len(by_key[KEY])} requests with the shared key, {len(by_key[NEW])} with "
              f"the client's own, {len(refused)} not answered 200: {refused[:5]}")
        assert len(by_key[KEY]) >= 20 and len(by_key[NEW]) >= 20 and refused == []
        assert http("POST", f"{front}/v1/chat/completions", chat, KEY)[0] == 401
        assert http("POST", f"{front}/v1/chat/completions", chat, NEW)[0] == 200
    finally:
        door.stop_all(procs)
        for replica in replicas:
            replica.stop()
