"""`modelfleet retire` refuses a host the inventory still serves under every spelling pyinfra accepts for it (a
connector prefix, another notation of the address, a name resolving to it, an SSH alias, case and the trailing dot
of a name), before anything connects; an argument that is not one host (a comma list, another connector, a user
or a port in it) is refused; a host it cannot reach is reported as not retired (exit 1, "ok": false)."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest
from click.testing import CliRunner
from pyinfra.connectors.sshuserclient import client as ssh_client

from modelfleet.base import targets
from modelfleet.cli import main
from modelfleet.cli.common import open_checked
from modelfleet.run import retire

HOST = {"hardware": "h200", "gpu_count": 1, "model": "qwen3-8b", "engine": "vllm", "gpu_stack": False,
        "revision": "0" * 40}

# Each served host of the inventory below, with spellings pyinfra accepts for it (it connects each of them to
# the served host).
SPELLINGS = {
    "g4": ["10.9.8.7", "@ssh/10.9.8.7", "10.9.8.7.", "0X0A090807", "012.011.010.07", "0x0a090807", "168364039",
           "10.9.2055", "10.9.8.07", "::ffff:10.9.8.7", "[::ffff:10.9.8.7]", "@ssh/[::ffff:a09:807]", "g4", "G4",
           "g4.", "@ssh/G4.", "alias-of-g4"],
    "g6": ["2001:db8::7", "2001:0DB8:0000:0000:0000:0000:0000:0007", "[2001:db8::7]", "@ssh/2001:db8:0::7",
           "@ssh/[2001:DB8::7]", "fe80::1%lo"],
    "byname": ["localhost", "LOCALHOST.", "127.0.0.1", "127.1", "0x7f000001", "2130706433", "::1", "[::1]",
               "@ssh/localhost", "@ssh/0:0:0:0:0:0:0:1"],
    "@local": ["@local"],
}


@pytest.fixture(autouse=True)
def made_up_names_do_not_resolve(monkeypatch):
    """The inventories' made-up names (g4, byname, gone.invalid...) fail at once, as a resolver answers them (no
    such name), never through the machine's resolver: a burst of them waited out its 5 s timeout. Addresses, and
    the names /etc/hosts gives (localhost, this machine's), resolve as ever."""
    real = socket.getaddrinfo
    known = {"localhost", socket.gethostname().lower()}

    def getaddrinfo(host, *args, **kwargs):
        try:
            real(host, None, flags=socket.AI_NUMERICHOST)
        except (socket.gaierror, UnicodeError, TypeError):
            if str(host).lower().rstrip(".") not in known:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known") from None
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture
def inv(tmp_path, monkeypatch):
    """g4 and g6 by address (ssh_hostname), byname by a name (ssh_hostname localhost); an SSH alias for g4 in
    the SSH config pyinfra reads."""
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("Host alias-of-g4\n  HostName 10.9.8.7\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(ssh_client.get_ssh_config, "cache", {})
    path = tmp_path / "inv.py"
    hosts = [("g4", {**HOST, "ssh_hostname": "10.9.8.7"}), ("g6", {**HOST, "ssh_hostname": "2001:db8::7"}),
             ("byname", {**HOST, "ssh_hostname": "localhost", "port": 8001}), ("fe", {**HOST, "port": 8002,
                                                                                  "ssh_hostname": "fe80::1"})]
    path.write_text(f"gpus = {hosts!r}\n")
    return path


@pytest.fixture
def no_connection(monkeypatch):
    """Any process started (pyinfra) or connection opened fails the test."""
    def refused(*args, **kwargs):
        raise AssertionError(f"connected: {args}")

    monkeypatch.setattr(subprocess, "run", refused)
    monkeypatch.setattr(subprocess, "Popen", refused)
    monkeypatch.setattr("socket.create_connection", refused)


@pytest.mark.parametrize("served", [h for h in SPELLINGS if h != "@local"])
def test_a_served_host_is_refused_under_every_spelling_before_connecting(inv, no_connection, served):
    out = CliRunner().invoke(main, ["retire", str(inv), *SPELLINGS[served], "-y"])
    assert out.exit_code == 2, out.output
    for given in SPELLINGS[served]:
        host = "fe" if given.startswith("fe80") else served
        assert f"modelfleet retire: {given} reaches host {host} of the inventory" in out.output, given


def test_this_machine_is_refused_under_its_spellings_where_the_inventory_serves_it_locally(tmp_path, no_connection):
    path = tmp_path / "inv.py"
    path.write_text(f"gpus = {[('@local', HOST)]!r}\n")
    for given in ["@local", "localhost", "127.0.0.1", "::1", "0x7f000001"]:
        out = CliRunner().invoke(main, ["retire", str(path), given, "-y"])
        assert out.exit_code == 2 and f"{given} reaches host @local of the inventory" in out.output, out.output


@pytest.mark.parametrize("given,words", [
    ("10.1.1.1,10.9.8.7", "is a list"), ("10.9.8.7,", "is a list"), ("@docker/abc", "not through @docker"),
    ("@dockerssh/10.9.8.7:abc", "not through @dockerssh"), ("@chroot/srv", "not through @chroot"),
    ("@SSH/10.1.1.1", "not through @SSH"), ("@ssh/", "SSH"), ("root@10.1.1.1", "--ssh-user"),
    ("10.1.1.1:2222", "--ssh-port"), ("[::1]:22", "--ssh-port"), ("inventories/prod.py", "looks like a path"),
    (" 10.1.1.1", "without spaces"), ("10.1.1.1 g4", "without spaces"), ("", "without spaces"),
])
def test_an_argument_that_is_not_one_host_is_refused_before_connecting(inv, no_connection, given, words):
    out = CliRunner().invoke(main, ["retire", str(inv), given, "-y"])
    assert out.exit_code == 2 and words in out.output, out.output


def test_two_spellings_of_one_host_are_refused(inv, no_connection):
    out = CliRunner().invoke(main, ["retire", str(inv), "10.1.1.1", "0x0a010101", "-y"])
    assert out.exit_code == 2 and "0x0a010101 and 10.1.1.1 reach the same host (10.1.1.1)" in out.output


def test_every_spelling_reaches_the_same_addresses_as_getaddrinfo_gives(inv):
    """The table's spellings, resolved without the CLI: each lands on its host's address, as paramiko would."""
    result = open_checked(str(inv))
    served = targets.served(result)
    for host, spellings in SPELLINGS.items():
        if host == "@local":
            continue
        for given in spellings:
            t = targets.target(given)
            _, reached = served["fe" if given.startswith("fe80") else host]
            assert t.addresses & reached or t.names & served[host][0], (given, t)


def test_a_spelling_of_another_address_is_not_taken_for_a_served_host(inv):
    """Octal is octal (inet_aton, as getaddrinfo reads it): 010.9.8.7 is 8.9.8.7, not g4's 10.9.8.7."""
    result = open_checked(str(inv))
    for given, address in (("010.9.8.7", "8.9.8.7"), ("10.9.8.070", "10.9.8.56"), ("0x0a090806", "10.9.8.6")):
        t = targets.target(given)
        assert t.addresses == {address} and targets.still_served(result, [t]) == [], (given, t)


def test_an_address_is_refused_while_a_served_host_does_not_resolve(tmp_path, no_connection):
    """A served host whose name resolves to nothing now may be the very address given: refused, naming it."""
    path = tmp_path / "inv.py"
    path.write_text(f"gpus = {[('gpu5', {**HOST, 'ssh_hostname': 'gpu5.invalid'})]!r}\n")
    result = open_checked(str(path))
    said = targets.still_served(result, [targets.target("10.0.0.5")])
    assert len(said) == 1 and "gpu5" in said[0] and "do not resolve" in said[0], said


def test_a_name_that_does_not_resolve_is_not_retired(inv, no_connection):
    out = CliRunner().invoke(main, ["retire", str(inv), "gone.invalid", "--json", "-y"])
    assert out.exit_code == 1
    said = json.loads(out.stdout)
    assert said["ok"] is False and said["hosts"] == [
        {"host": "gone.invalid", "retired": None, "error": said["hosts"][0]["error"]}]
    assert said["hosts"][0]["error"].startswith("not reached: gone.invalid does not resolve")


def test_a_host_that_refuses_the_connection_is_not_retired(inv, tmp_path):
    """A real pyinfra run against a closed port of this machine's loopback: exit 1, "ok": false, the host named."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.3", 0))
        port = s.getsockname()[1]
    out = CliRunner().invoke(main, ["retire", str(inv), "127.0.0.3", "--ssh-port", str(port), "--json", "-y"])
    assert out.exit_code == 1, out.output
    said = json.loads(out.stdout)
    assert said["ok"] is False and said["hosts"][0]["retired"] is None
    assert said["hosts"][0]["error"].startswith("not reached: Could not connect")


def test_the_deploy_refuses_a_host_reached_at_another_address_than_checked():
    """The retire deploy's own guard, on the address pyinfra really connected to: one the inventory serves, or
    not one the target resolved to when checked (DNS moved between the check and the connection)."""
    guard = {"served": {"10.9.8.7": "g4"}, "proved": {"@ssh/gpu9": ["10.1.1.9"]}}
    assert "host g4, which the inventory still serves" in retire.guard_refusal("@ssh/gpu9", "10.9.8.7", guard)
    assert "not an address @ssh/gpu9 resolved to" in retire.guard_refusal("@ssh/gpu9", "10.1.1.8", guard)
    assert retire.guard_refusal("@ssh/gpu9", "10.1.1.9", guard) is None
    assert retire.guard_refusal("@local", None, guard) is None
