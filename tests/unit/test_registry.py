"""Digest pinning against a registry that wants a login: a real HTTP server here speaks the Registry v2 token
protocol (401 + WWW-Authenticate Bearer, a token service that checks Basic credentials, manifest HEAD with
Docker-Content-Digest). Credentials come from Docker's config.json as Docker finds it; they go only to the
token service, never follow a redirect, never appear in an error; plain HTTP only for loopback and what the
site names in insecure_registries."""

import base64
import json
import os
import stat
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from modelfleet.base import registry
from modelfleet.base.registry import RegistryError

USER, PASSWORD = "robot$ci", "s3cr3t-pa55"
DIGEST = "sha256:" + "ab" * 32
TOKEN = "issued-token-123"


class Registry:
    """A registry and its token service on one loopback port. `private`: repositories needing credentials;
    `basic`: answer 401 with a Basic challenge instead of Bearer; `realm`: another realm to name."""

    def __init__(self):
        self.requests: list[dict] = []
        self.private = {"team/engine"}
        self.basic = False
        self.realm = None
        self.redirect_token_to = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _record(self, body=b""):
                outer.requests.append({"method": self.command, "path": self.path,
                                       "authorization": self.headers.get("Authorization"), "body": body})

            def _reply(self, code, headers=None, body=b""):
                self.send_response(code)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _token(self, fields: dict, auth: str | None):
                repo = fields.get("scope", "").split(":")[1] if fields.get("scope") else ""
                good = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
                if fields.get("grant_type") == "refresh_token":
                    ok = fields.get("refresh_token") == "identity-xyz"
                elif auth:
                    ok = auth == good
                else:
                    ok = repo not in outer.private
                if not ok or fields.get("service") != "test-registry":
                    return self._reply(401, body=b'{"errors":[{"code":"UNAUTHORIZED"}]}')
                self._reply(200, {"Content-Type": "application/json"}, json.dumps({"token": TOKEN}).encode())

            def do_HEAD(self):
                self._record()
                if self.path.startswith("/v2/") and "/manifests/" in self.path:
                    if outer.basic:
                        good = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
                        if self.headers.get("Authorization") != good:
                            return self._reply(401, {"WWW-Authenticate": 'Basic realm="test"'})
                    elif self.headers.get("Authorization") != f"Bearer {TOKEN}":
                        repo = self.path[len("/v2/"):].split("/manifests/")[0]
                        realm = outer.realm or f"http://127.0.0.1:{outer.port}/token"
                        return self._reply(401, {"WWW-Authenticate": f'Bearer realm="{realm}",service="test-registry",'
                                                                     f'scope="repository:{repo}:pull"'})
                    return self._reply(200, {"Docker-Content-Digest": DIGEST})
                self._reply(404)

            def do_GET(self):
                self._record()
                url = urllib.parse.urlsplit(self.path)
                if url.path == "/token":
                    if outer.redirect_token_to:
                        return self._reply(302, {"Location": f"{outer.redirect_token_to}?{url.query}"})
                    fields = dict(urllib.parse.parse_qsl(url.query))
                    return self._token(fields, self.headers.get("Authorization"))
                if url.path == "/elsewhere":
                    fields = dict(urllib.parse.parse_qsl(url.query))
                    return self._token(fields, self.headers.get("Authorization"))
                self._reply(404)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._record(body)
                self._token(dict(urllib.parse.parse_qsl(body.decode())), self.headers.get("Authorization"))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.name = f"127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()  # a quick shutdown

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def reg():
    server = Registry()
    yield server
    server.close()


@pytest.fixture()
def docker_config(tmp_path, monkeypatch):
    """DOCKER_CONFIG pointing at an empty folder; write(auths) puts a config.json there."""
    folder = tmp_path / "docker"
    folder.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(folder))

    def write(config: dict) -> Path:
        path = folder / "config.json"
        path.write_text(json.dumps(config))
        return path

    return write


def auth(user=USER, password=PASSWORD) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def secrets_in(text: str) -> list[str]:
    return [s for s in (PASSWORD, auth(), TOKEN, "identity-xyz") if s in text]


def test_bearer_flow_with_basic_credentials_from_config_json(reg, docker_config):
    docker_config({"auths": {reg.name: {"auth": auth()}}})
    assert registry.pinned(f"{reg.name}/team/engine:v1") == f"{reg.name}/team/engine:v1@{DIGEST}"
    first, token, again = reg.requests
    assert first["method"] == "HEAD" and first["authorization"] is None  # anonymous first: the challenge
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(token["path"]).query))
    assert query == {"service": "test-registry", "scope": "repository:team/engine:pull"}
    assert token["authorization"] == f"Basic {auth()}"  # credentials go to the token service only
    assert again["authorization"] == f"Bearer {TOKEN}" and again["path"] == "/v2/team/engine/manifests/v1"


def test_wrong_credentials_are_refused_naming_the_config_never_the_secret(reg, docker_config):
    path = docker_config({"auths": {reg.name: {"auth": auth(password="wrong-" + PASSWORD)}}})
    with pytest.raises(RegistryError) as error:
        registry.resolve_digest(f"{reg.name}/team/engine:v1")
    message = str(error.value)
    assert "refused the credentials" in message and str(path) in message and "docker login" in message
    assert not secrets_in(message) and "wrong-" not in message and USER not in message


def test_public_repository_gets_an_anonymous_token_and_a_private_one_says_how_to_log_in(reg, docker_config):
    assert registry.resolve_digest(f"{reg.name}/library/public:1") == DIGEST
    assert all(r["authorization"] in (None, f"Bearer {TOKEN}") for r in reg.requests)
    with pytest.raises(RegistryError, match=rf"anonymous token \(HTTP 401\): `docker login {reg.name}`"):
        registry.resolve_digest(f"{reg.name}/team/engine:v1")


def test_basic_challenge_is_answered_with_the_credentials(reg, docker_config):
    reg.basic = True
    docker_config({"auths": {f"http://{reg.name}": {"auth": auth()}}})  # a key with a scheme names it too
    assert registry.resolve_digest(f"{reg.name}/team/engine:v2") == DIGEST
    assert reg.requests[-1]["authorization"] == f"Basic {auth()}"


def test_identity_token_takes_the_oauth_refresh_grant(reg, docker_config):
    docker_config({"auths": {reg.name: {"identitytoken": "identity-xyz"}}})
    assert registry.resolve_digest(f"{reg.name}/team/engine:v3") == DIGEST
    post = next(r for r in reg.requests if r["method"] == "POST")
    fields = dict(urllib.parse.parse_qsl(post["body"].decode()))
    assert fields["grant_type"] == "refresh_token" and fields["refresh_token"] == "identity-xyz"
    assert fields["scope"] == "repository:team/engine:pull" and post["authorization"] is None


def test_credentials_never_follow_a_redirect(reg, docker_config):
    docker_config({"auths": {reg.name: {"auth": auth()}}})
    reg.redirect_token_to = f"http://localhost:{reg.port}/elsewhere"  # another host name: urllib follows it
    with pytest.raises(RegistryError, match="refused the credentials"):
        registry.resolve_digest(f"{reg.name}/team/engine:v4")
    elsewhere = next(r for r in reg.requests if r["path"].startswith("/elsewhere"))
    assert elsewhere["authorization"] is None


def test_credential_helper_gets_the_server_on_stdin_and_the_secret_stays_out_of_argv(reg, docker_config, tmp_path,
                                                                                    monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    helper = bin_dir / "docker-credential-testhelper"
    log = tmp_path / "helper.log"
    helper.write_text(f"""#!/bin/sh
server=$(cat)
echo "$0 $*|$server" >> {log}
printf '{{"ServerURL":"%s","Username":"{USER}","Secret":"{PASSWORD}"}}' "$server"
""")
    helper.chmod(helper.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    docker_config({"credHelpers": {reg.name: "testhelper"}, "auths": {reg.name: {"auth": auth(password="stale")}}})
    assert registry.resolve_digest(f"{reg.name}/team/engine:v5") == DIGEST
    assert log.read_text().strip() == f"{helper} get|{reg.name}"
    found = registry.credentials(reg.name)
    assert "helper" in repr(found) and PASSWORD not in repr(found) and PASSWORD not in str(found)


def test_config_is_found_as_docker_finds_it(tmp_path, monkeypatch):
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert registry.docker_config_path() == tmp_path / ".docker" / "config.json"
    (tmp_path / ".docker").mkdir()
    (tmp_path / ".docker" / "config.json").write_text(json.dumps(
        {"auths": {"https://index.docker.io/v1/": {"auth": auth()}, "reg.site:5000": {"auth": auth("u", "p")}}}))
    hub = registry.credentials(registry.DOCKER_HUB)  # docker login's key for Docker Hub
    assert (hub.username, hub.password) == (USER, PASSWORD)
    assert registry.credentials("reg.site:5000").username == "u" and registry.credentials("other.site") is None
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "elsewhere"))
    assert registry.docker_config_path() == tmp_path / "elsewhere" / "config.json"
    assert registry.credentials("reg.site:5000") is None


def test_a_broken_auth_entry_is_named_without_its_value(docker_config):
    path = docker_config({"auths": {"reg.site": {"auth": "not base64 !!"}}})
    with pytest.raises(RegistryError) as error:
        registry.credentials("reg.site")
    assert str(path) in str(error.value) and "not base64 !!" not in str(error.value)


def test_plain_http_only_for_loopback_and_registries_named_insecure(monkeypatch):
    assert registry.base_url("127.0.0.1:5000") == "http://127.0.0.1:5000/v2/"
    assert registry.base_url("localhost:5000") == "http://localhost:5000/v2/"
    assert registry.base_url("reg.site:5000") == "https://reg.site:5000/v2/"
    assert registry.base_url("reg.site:5000", frozenset({"reg.site:5000"})) == "http://reg.site:5000/v2/"
    assert registry.base_url("reg.site:5001", frozenset({"reg.site:5000"})) == "https://reg.site:5001/v2/"
    asked = []

    def urlopen(req, timeout=None):
        asked.append(req.full_url)
        raise OSError("no network in this test")

    monkeypatch.setattr(registry.urllib.request, "urlopen", urlopen)
    with pytest.raises(RegistryError, match="insecure_registries"):
        registry.resolve_digest("reg.site:5000/team/engine:v1", insecure=frozenset())
    with pytest.raises(RegistryError):
        registry.resolve_digest("reg.site:5000/team/engine:v1", insecure=frozenset({"reg.site:5000"}))
    assert asked == ["https://reg.site:5000/v2/team/engine/manifests/v1",
                     "http://reg.site:5000/v2/team/engine/manifests/v1"]


def test_credentials_are_not_sent_to_a_plain_http_token_service_off_loopback(reg, docker_config):
    docker_config({"auths": {reg.name: {"auth": auth()}}})
    reg.realm = "http://auth.example.invalid/token"
    with pytest.raises(RegistryError, match="not HTTPS; credentials are not sent"):
        registry.resolve_digest(f"{reg.name}/team/engine:v6")
    assert [r["method"] for r in reg.requests] == ["HEAD"]  # nothing went to the realm


def test_a_run_reads_insecure_registries_from_the_inventory_pyinfra_loaded():
    from pyinfra.api import Config, Inventory, State
    from pyinfra.context import ctx_state

    inventory = Inventory(([("h1", {"insecure_registries": ["reg.site:5000"]}), ("h2", {})], {}))
    state = State(inventory, Config())
    assert registry.site_insecure() == frozenset()
    with ctx_state.use(state):
        assert registry.site_insecure() == frozenset({"reg.site:5000"})


def test_the_schema_takes_insecure_registries_as_host_and_port():
    from modelfleet.plan.inventory import resolve

    ok = resolve([("h", {"hardware": "h200", "gpu_count": 1, "model": "tiny-lab", "engine": "vllm",
                        "recipe": "tiny-lab-vllm", "insecure_registries": ["reg.site:5000", "mirror.lan"]})])
    assert ok.errors == []
    bad = resolve([("h", {"hardware": "h200", "gpu_count": 1, "model": "tiny-lab", "engine": "vllm",
                         "recipe": "tiny-lab-vllm", "insecure_registries": ["http://reg.site:5000"]})])
    assert [f.split(".")[0] for _, f, _ in bad.errors] == ["insecure_registries"]
