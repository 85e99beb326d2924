"""A TCP port that counts the connections made to it: where pyinfra's SSH would go, for tests that prove
nothing connected."""

import socket
import threading


class CountingListener:
    """An SSH port that counts the connections it is offered (and accepts none of the protocol)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port, self.count = self.sock.getsockname()[1], 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.count += 1
            conn.close()


def scripted_http(reply: bytes, seen: list | None = None, close: bool = True, reset: bool = False) -> str:
    """A source that answers each request with the bytes `reply` (status line, headers and all), keeping what
    each request said in `seen`; then closes (resets, with `reset`), or with `close=False` keeps the connection
    open and silent (a frozen source). Its URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held = []

    def loop():
        while True:
            conn, _ = listener.accept()
            request = conn.recv(65536)
            if seen is not None:
                seen.append(request)
            conn.sendall(reply)
            if not close:
                held.append(conn)
                continue
            if reset:  # RST instead of FIN
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            conn.close()

    threading.Thread(target=loop, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}/"


def free_port() -> int:
    """A loopback port free now (bound and released: another process could take it before the caller does)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
