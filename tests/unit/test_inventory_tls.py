"""A front door's TLS, checked as a client and nginx would take it (issue 50, item 2): each way a certificate and
key that `validate` passed still fails every client is refused, naming the front door and the field, with the
other errors at once; the name clients use is `router_server_name` (the URL `show` and `validate` print) and the
verify gate checks the certificate against it, whatever address it dials."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from modelfleet.plan.inventory import resolve
from modelfleet.plan.inventory import tls as tls_rules
from tests.helpers.front_doors import KEY, fleet
from tests.helpers.pem import certificate


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("MF_ROUTER_KEY", KEY)


def problems(tmp_path, cert, key, **extra):
    result = resolve(fleet("vllm", router_tls_cert=str(cert), router_tls_key=str(key), **extra))
    return [(w, f, m) for w, f, m in result.errors], result


def fields(found):
    return sorted({f for _, f, _ in found})


def test_a_sound_pair_for_the_name_clients_use_passes_and_that_name_is_the_url(tmp_path):
    cert, key = certificate(tmp_path, names=("DNS:door.example.com",))
    found, result = problems(tmp_path, cert, key, router_server_name="door.example.com")
    assert found == [] and result.warnings == []
    door = result.routers["tiny-lab"]
    assert door.base_url == "https://door.example.com:8800" and door.dial_url == "https://10.0.0.1:8800"
    # Without a name, clients use the address: the certificate must cover that (it does not: refused).
    found, _ = problems(tmp_path, cert, key)
    assert fields(found) == ["router_server_name"] and "10.0.0.1: not among the names" in found[0][2]


@pytest.mark.parametrize("case,names,days,extra,field,words", [
    ("names miss the server name", ("DNS:other.example.com",), (-1, 90), {"router_server_name": "door.example.com"},
     "router_server_name", "not among the names"),
    ("a wildcard covers one label only", ("DNS:*.example.com",), (-1, 90), {"router_server_name": "a.door.example.com"},
     "router_server_name", "not among the names"),
    ("no subjectAltName at all (the CN is not read)", (), (-1, 90), {"router_server_name": "door.lab"},
     "router_server_name", "not among the names"),
    ("an IP name is only an IP entry", ("DNS:10.0.0.1",), (-1, 90), {}, "router_server_name", "not among"),
    ("expired", ("DNS:door.lab",), (-30, -1), {"router_server_name": "door.lab"}, "router_tls_cert", "expired on"),
    ("not yet valid", ("DNS:door.lab",), (2, 90), {"router_server_name": "door.lab"}, "router_tls_cert",
     "not valid before"),
])
def test_a_certificate_clients_refuse_is_refused(tmp_path, case, names, days, extra, field, words):
    cert, key = certificate(tmp_path, names=names, days=days)
    found, _ = problems(tmp_path, cert, key, **extra)
    assert [(w, f) for w, f, _ in found] == [("router tiny-lab", field)], (case, found)
    assert words in found[0][2], found


def test_names_that_do_cover_pass(tmp_path):
    for names, name in ((("DNS:*.example.com",), "door.example.com"), (("IP:10.0.0.1",), None),
                        (("DNS:Door.Example.COM",), "door.example.com")):
        cert, key = certificate(tmp_path, names=names)
        found, _ = problems(tmp_path, cert, key, **({"router_server_name": name} if name else {}))
        assert found == [], (names, found)


def test_close_to_its_end_is_a_warning_that_strict_refuses(tmp_path):
    cert, key = certificate(tmp_path, names=("DNS:door.lab",), days=(-1, tls_rules.EXPIRY_WARNING_DAYS - 2))
    found, result = problems(tmp_path, cert, key, router_server_name="door.lab")
    assert found == [] and [(w, f) for w, f, _ in result.warnings] == [("router tiny-lab", "router_tls_cert")]
    assert "renew it" in result.warnings[0][2]


def test_the_key_of_another_certificate_is_refused(tmp_path):
    _, other = certificate(tmp_path, names=("DNS:door.lab",), name="other")
    cert, key = certificate(tmp_path, names=("DNS:door.lab",), key=other.read_text())
    found, _ = problems(tmp_path, cert, key, router_server_name="door.lab")
    assert fields(found) == ["router_tls_key"] and "is not the key of" in found[0][2]
    assert "PRIVATE" not in found[0][2]


def _openssl(*argv, stdin=None) -> str:
    return subprocess.run(["openssl", *argv], check=True, capture_output=True, text=True, input=stdin).stdout


def _ssh_key(tmp_path) -> str:
    path = tmp_path / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.read_text()


@pytest.mark.parametrize("case,make,words", [
    ("PKCS#8 encrypted", lambda t, pem: _openssl("pkcs8", "-topk8", "-v2", "aes-256-cbc", "-passout", "pass:pw",
                                                 stdin=pem), "encrypted (PKCS#8"),
    ("traditional PEM encrypted", lambda t, pem: _openssl("ec", "-aes256", "-passout", "pass:pw", stdin=pem),
     "encrypted (a PEM passphrase"),
    ("an OpenSSH key", lambda t, pem: _ssh_key(t), "OpenSSH private key"),
    ("a PuTTY key", lambda t, pem: "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\n", "PuTTY key"),
    ("a certificate where the key belongs", lambda t, pem: (t / "door.crt").read_text(), "not a PEM private key"),
    ("garbage", lambda t, pem: "\n".join([pem.splitlines()[0], "not base64", pem.splitlines()[-1], ""]),
     "not a PEM private key"),  # the made key's own armour around a body that is not base64
])
def test_a_key_nginx_cannot_start_with_is_refused_with_the_reason(tmp_path, case, make, words):
    cert, key = certificate(tmp_path, names=("DNS:door.lab",))
    if case.startswith("an OpenSSH") and subprocess.run(["which", "ssh-keygen"], capture_output=True).returncode:
        pytest.skip("no ssh-keygen here")
    key.write_text(make(tmp_path, key.read_text()))
    found, _ = problems(tmp_path, cert, key, router_server_name="door.lab")
    assert [(w, f) for w, f, _ in found] == [("router tiny-lab", "router_tls_key")], (case, found)
    assert words in found[0][2]


@pytest.mark.parametrize("mode,field", [(0o644, "router_tls_key"), (0o640, "router_tls_key"),
                                        (0o606, "router_tls_key"), (0o600, None)])
def test_a_key_file_others_can_read_is_refused(tmp_path, mode, field):
    cert, key = certificate(tmp_path, names=("DNS:door.lab",))
    os.chmod(key, mode)
    found, _ = problems(tmp_path, cert, key, router_server_name="door.lab")
    assert fields(found) == ([field] if field else []), found
    if field:
        assert f"mode {mode:04o}" in found[0][2] and "chmod 600" in found[0][2]


def test_a_certificate_others_can_replace_is_refused(tmp_path):
    cert, key = certificate(tmp_path, names=("DNS:door.lab",))
    os.chmod(cert, 0o666)
    found, _ = problems(tmp_path, cert, key, router_server_name="door.lab")
    assert fields(found) == ["router_tls_cert"] and "writable by group or others" in found[0][2]


def test_every_problem_of_the_pair_at_once(tmp_path):
    """Expired, another's key, readable by all, names that miss: four errors of one front door, one run."""
    _, other = certificate(tmp_path, names=("DNS:x",), name="other")
    cert, key = certificate(tmp_path, names=("DNS:elsewhere.lab",), days=(-30, -1), key=other.read_text())
    os.chmod(key, 0o644)
    found, _ = problems(tmp_path, cert, key, router_server_name="door.lab")
    assert fields(found) == ["router_server_name", "router_tls_cert", "router_tls_key"]
    assert len(found) == 4, found


def test_router_server_name_is_a_host_name_or_address_and_only_with_a_router(tmp_path):
    result = resolve(fleet("vllm", router_server_name="door lab;"))
    assert [(f, m) for _, f, m in result.errors] == [("router_server_name",
                                                      "is neither an IP address nor a host name")]
    hosts = [(n, {k: v for k, v in d.items() if k != "router"} | {"router_server_name": "door.lab"})
             for n, d in fleet("vllm")]
    assert [(w, f) for w, f, _ in resolve(hosts).errors] == [("host r1", "router_server_name")]


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        body = b'{"data": [{"id": "tiny-lab"}]}' if self.path == "/v1/models" else b"{}"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_the_verify_gate_checks_the_name_clients_use_not_the_address_it_dials(tmp_path):
    """A real TLS server on loopback whose certificate names door.lab (not 127.0.0.1): the gate's readiness
    passes when the front door's name is door.lab, and fails on the name when it is another, although the
    certificate is the pinned one both times (before: hostname checking was off, so both passed)."""
    from modelfleet.run.checks import Endpoint, ready

    cert, key = certificate(tmp_path, names=("DNS:door.lab",))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"https://127.0.0.1:{server.server_address[1]}"
        good = Endpoint(name="r1/router", base_url=url, model="tiny-lab", engine="vllm", api_key="k",
                        ca_file=str(cert), server_name="door.lab")
        assert ready.report(good, 3)["ok"]
        wrong = Endpoint(**{**good.__dict__, "server_name": "other.lab"})
        answer = ready.report(wrong, 1)
        assert not answer["ok"] and "other.lab" in answer["readiness"]["error"], answer
    finally:
        server.shutdown()


def test_validate_and_show_print_the_url_by_the_name_clients_use(tmp_path):
    from click.testing import CliRunner

    from modelfleet.cli import main

    cert, key = certificate(tmp_path, names=("DNS:door.example.com",))
    hosts = fleet("vllm", router_tls_cert=str(cert), router_tls_key=str(key), router_server_name="door.example.com")
    inv = tmp_path / "inv.py"
    inv.write_text(f"doors = {hosts!r}\n")
    said = CliRunner().invoke(main, ["validate", str(inv)])
    assert said.exit_code == 0 and "https://door.example.com:8800/v1 (TLS)" in said.output, said.output
    shown = CliRunner().invoke(main, ["show", str(inv), "r1"])
    assert "clients use https://door.example.com:8800/v1" in shown.output and "10.0.0.1:8800/v1" not in shown.output


def test_a_door_on_every_address_is_printed_at_the_hosts_address_not_0_0_0_0():
    result = resolve(fleet("vllm", router_bind_address="0.0.0.0"))
    door = result.routers["tiny-lab"]
    assert result.errors == [] and door.base_url == "http://10.0.0.1:8800" and door.dial_url == door.base_url
    named = resolve(fleet("vllm", router_bind_address="0.0.0.0", router_server_name="door.lab")).routers["tiny-lab"]
    assert named.base_url == "http://door.lab:8800" and named.dial_url == "http://10.0.0.1:8800"


def test_urls_lists_the_front_door_by_the_name_clients_use_and_not_as_an_origin_to_let_out(tmp_path):
    from click.testing import CliRunner

    from modelfleet.cli import main

    cert, key = certificate(tmp_path, names=("DNS:door.example.com",))
    hosts = fleet("vllm", router_tls_cert=str(cert), router_tls_key=str(key), router_server_name="door.example.com")
    inv = tmp_path / "inv.py"
    inv.write_text(f"doors = {hosts!r}\n")
    said = CliRunner().invoke(main, ["urls", str(inv), "--json"])
    out = json.loads(said.stdout)
    doors = [e for e in out["urls"] if e["kind"] == "front door"]
    assert [(e["url"], e["hosts"]) for e in doors] == [("https://door.example.com:8800/v1", ["r1"])], doors
    assert not any("door.example.com" in origin for origin in out["origins"])
