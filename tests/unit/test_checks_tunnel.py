"""Local port forwarding over SSH (checks/tunnel.py) through a real paramiko transport: an SSH server in this
process on loopback that opens direct-tcpip channels as sshd does, carrying connections to an echo service on
the "host's" loopback; `port_free` against a listening and a closed port; a pyinfra host with no SSH transport."""

from __future__ import annotations

import io
import socket
import threading

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pyinfra.api import Config, Inventory, State

from modelfleet.run.checks import tunnel


def listening(handle) -> tuple[socket.socket, int]:
    """A loopback listener that runs `handle(conn)` per connection, on a thread (stop it with `stop`)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def loop():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    return server, server.getsockname()[1]


def stop(server: socket.socket) -> None:
    server.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() alone leaves the port listening
    server.close()


def echo(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)


class Sshd(paramiko.ServerInterface):
    """What the tunnel asks of sshd: a password login and direct-tcpip channels (opened here, as sshd would)."""

    def __init__(self):
        self.asked: list[tuple[str, int]] = []

    def get_allowed_auths(self, username):
        return "password"

    def check_auth_password(self, username, password):
        return paramiko.AUTH_SUCCESSFUL if password == "lab" else paramiko.AUTH_FAILED

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED if kind == "direct-tcpip" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_direct_tcpip_request(self, chanid, origin, destination):
        self.asked.append(destination)
        try:
            target = socket.create_connection(destination, timeout=2)
        except OSError:
            return paramiko.OPEN_FAILED_CONNECT_FAILED
        self.targets[chanid] = target
        return paramiko.OPEN_SUCCEEDED


@pytest.fixture()
def transport():
    """A client transport to an in-process SSH server; yields (transport, the server's interface)."""
    pem = Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                                     serialization.NoEncryption())
    host_key = paramiko.Ed25519Key.from_private_key(io.StringIO(pem.decode()))
    sshd = Sshd()
    sshd.targets = {}
    servers = []

    def serve(conn):
        server = paramiko.Transport(conn)
        server.add_server_key(host_key)
        server.start_server(server=sshd)
        servers.append(server)
        while server.is_active():
            channel = server.accept(timeout=0.2)
            if channel is not None:
                target = sshd.targets.pop(channel.get_id())
                threading.Thread(target=carry, args=(channel, target), daemon=True).start()
                threading.Thread(target=carry, args=(target, channel), daemon=True).start()

    listener, port = listening(serve)
    client = paramiko.Transport(("127.0.0.1", port))
    client.connect(username="lab", password="lab")
    yield client, sshd
    client.close()
    stop(listener)
    for server in servers:
        server.close()


def round_trip(port: int, payload: bytes) -> bytes:
    """What comes back for `payload`: as many bytes, or fewer where the connection is closed first."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(payload)
        out = b""
        try:
            while len(out) < len(payload) and (data := conn.recv(65536)):
                out += data
        except ConnectionResetError:
            pass
    return out


def carry(source, sink) -> None:
    """sshd's side of a forwarded connection: bytes one way until either end closes."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        source.close()
        sink.close()


def test_connections_to_the_local_port_reach_the_remote_service(transport):
    client, sshd = transport
    service, service_port = listening(echo)
    payload = b"x" * 200_000  # more than one read: the pumps carry it whole, in order
    with tunnel.forward(client, "127.0.0.1", service_port) as local_port:
        assert not tunnel.port_free(local_port)
        assert round_trip(local_port, payload) == payload
        assert round_trip(local_port, b"again") == b"again"  # each connection its own channel
    assert sshd.asked == [("127.0.0.1", service_port)] * 2
    stop(service)


def test_the_local_port_is_let_go_when_the_tunnel_closes(transport):
    client, _ = transport
    service, service_port = listening(echo)
    with tunnel.forward(client, "127.0.0.1", service_port) as local_port:
        round_trip(local_port, b"hi")
    assert tunnel.port_free(local_port)
    with tunnel.forward(client, "127.0.0.1", service_port, local_port=local_port) as again:
        assert again == local_port and round_trip(again, b"back") == b"back"
    stop(service)


def test_a_channel_the_host_refuses_closes_the_local_connection_and_the_tunnel_stays(transport):
    client, _ = transport
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed_port = unused.getsockname()[1]  # bound, never listening: sshd cannot connect
        with tunnel.forward(client, "127.0.0.1", closed_port) as local_port:
            assert round_trip(local_port, b"hello") == b""
            assert not tunnel.port_free(local_port)  # still accepting


def test_port_free_is_false_while_something_listens_and_true_after():
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a tunnel's listener (its connections too)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    with socket.create_connection(("127.0.0.1", port)):
        accepted, _ = server.accept()
        assert not tunnel.port_free(port)
        server.close()
        accepted.close()  # a tunnel's connection, closed first on its side: it lingers in TIME_WAIT
    assert tunnel.port_free(port)


def test_a_host_without_an_ssh_transport_is_refused_by_name():
    inventory = Inventory(([("@fake/gpu-01", {})], {}))
    State(inventory, Config())
    target = inventory.get_host("@fake/gpu-01")
    with pytest.raises(RuntimeError, match=r"@fake/gpu-01: 127.0.0.1:8000 listens on the host's loopback and this "
                                           r"connector \(FakeConnector\) has no SSH transport"):
        tunnel.through_host(target, "127.0.0.1", 8000)
