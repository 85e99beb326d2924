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
