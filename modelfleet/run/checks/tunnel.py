"""Local port forwarding over an SSH transport (paramiko): what `ssh -N -L P:127.0.0.1:PORT host` does, so the
control node's openai client can reach an endpoint that listens only on the host's loopback."""

from __future__ import annotations

import socket
import threading
from contextlib import contextmanager

import paramiko


def _pump(source, sink) -> None:
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except (OSError, EOFError):  # a socket or a channel whose transport went away
        pass
    finally:
        for end in (source, sink):
            try:
                end.close()
            except (OSError, EOFError):
                pass


def port_free(port: int, address: str = "127.0.0.1") -> bool:
    """Nothing listens there (connections of a closed tunnel lingering in TIME_WAIT do not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
            return True
        except OSError:
            return False


@contextmanager
def forward(transport: paramiko.Transport, remote_host: str, remote_port: int, local_port: int = 0):
    """Yield a local port on 127.0.0.1 whose connections are carried to remote_host:remote_port on the host."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", local_port))
    server.listen(16)
    stopping = threading.Event()

    def accept_loop():
        while not stopping.is_set():
            try:
                conn, peer = server.accept()
            except OSError:
                return
            try:
                channel = transport.open_channel("direct-tcpip", (remote_host, remote_port), peer)
            except (paramiko.SSHException, OSError):
                conn.close()
                continue
            threading.Thread(target=_pump, args=(conn, channel), daemon=True).start()
            threading.Thread(target=_pump, args=(channel, conn), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        stopping.set()
        try:  # wakes the accept() blocked in its thread: a bare close() leaves the port listening
            server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        server.close()


def through_host(target, remote_host: str, remote_port: int):
    """`forward` through pyinfra host `target`'s own SSH connection (an endpoint on that host's loopback)."""
    client = getattr(target.connector, "client", None)
    if client is None:
        raise RuntimeError(f"{target.name}: {remote_host}:{remote_port} listens on the host's loopback and this "
                           f"connector ({type(target.connector).__name__}) has no SSH transport to tunnel through")
    return forward(client.get_transport(), remote_host, remote_port)
