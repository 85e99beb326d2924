"""The checkpoint's listing, resolved on the control node before any host fetches it."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from modelfleet.plan import checkpoint
from tests.helpers.made_keys import made_key

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def mirror_with(tmp_path, files: dict) -> str:
    folder = tmp_path / "org" / "model" / COMMIT
    folder.mkdir(parents=True)
    (folder / checkpoint.MANIFEST).write_text(json.dumps({"repo": "org/model", "commit": COMMIT, "files": files}))
    return f"file://{tmp_path}"


@pytest.mark.parametrize("bad", ["../../etc/cron.d/x", "/etc/passwd", "weights/../../x"])
def test_a_listing_naming_a_file_outside_the_revision_is_refused_before_any_host_fetches(tmp_path, bad):
    source = mirror_with(tmp_path, {"config.json": {"size": 2}, bad: {"size": 1}})
    with pytest.raises(checkpoint.ModelSourceError, match="lists files outside its folder"):
        checkpoint.snapshot("org/model", COMMIT, "https://hub.invalid", "HF_TOKEN", source)


def test_a_listing_inside_the_revision_resolves(tmp_path):
    source = mirror_with(tmp_path, {"config.json": {"size": 2}, "weights/model.safetensors": {"size": 9}})
    snap = checkpoint.snapshot("org/model", COMMIT, "https://hub.invalid", "HF_TOKEN", source)
    assert (snap.commit, sorted(snap.files)) == (COMMIT, ["config.json", "weights/model.safetensors"])


class _Hub(BaseHTTPRequestHandler):
    """A hub that moved a repository: /api/models/old/m/... redirects on the same origin, /api/models/away/m/...
    to another origin (`elsewhere`); every request's Authorization header is kept in `seen`."""

    seen: list = []
    elsewhere = ""

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.seen.append((self.path.split("/")[3], self.headers.get("Authorization")))
        if self.path.startswith("/api/models/old/"):
            self.send_response(307)
            self.send_header("Location", self.path.replace("/old/", "/new/"))
        elif self.path.startswith("/api/models/away/") and self.elsewhere:  # the other origin answers it
            self.send_response(307)
            self.send_header("Location", self.elsewhere + self.path)
        else:
            body = json.dumps({"sha": COMMIT, "siblings": [{"rfilename": "config.json", "size": 2}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture()
def hubs():
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), type("H", (_Hub,), {"seen": []})) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    hub, other = (f"http://127.0.0.1:{s.server_address[1]}" for s in servers)
    servers[0].RequestHandlerClass.elsewhere = other
    yield hub, servers[0].RequestHandlerClass.seen, servers[1].RequestHandlerClass.seen
    for server in servers:
        server.shutdown()


def test_the_hub_token_follows_a_redirect_on_the_hubs_origin_and_no_other(hubs):
    hub, seen_hub, seen_other = hubs
    token = made_key("hub-token")
    moved = checkpoint._hub_metadata({"endpoint": hub, "token": token, "repo": "old/m", "revision": "main"})
    assert moved["commit"] == COMMIT  # a renamed repository still resolves, its token kept on the hub
    assert seen_hub == [("old", f"Bearer {token}"), ("new", f"Bearer {token}")]
    checkpoint._hub_metadata({"endpoint": hub, "token": token, "repo": "away/m", "revision": "main"})
    assert seen_other == [("away", None)]  # what another origin got: no token


def test_a_token_with_a_line_break_is_refused_without_saying_it(hubs):
    hub, seen_hub, _ = hubs
    token = made_key("hub-token")
    said = checkpoint._hub_metadata({"endpoint": hub, "token": token + "\n", "repo": "new/m", "revision": "main"})
    assert "line break" in said["error"] and token not in said["error"] and seen_hub == []
