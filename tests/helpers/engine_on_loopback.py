"""The lab's engine double (lab/engine_double) serving on a loopback port inside the test process: the engine a
client-side check (checks/probe.py, exposure.py, gate.py) talks to, keyed as the real engine keys its routes."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from http.server import ThreadingHTTPServer

from lab.engine_double import engine_double


@contextmanager
def engine_on_loopback(monkeypatch, engine: str, key: str | None = None, served: str = "tiny-lab", **faults):
    """Yield the double's base URL (no /v1). `faults`: its fault switches, MODELFLEET_DOUBLE_<NAME>=value."""
    monkeypatch.setenv("MODELFLEET_DOUBLE_LOAD_DELAY_S", "0")
    for name, value in faults.items():
        monkeypatch.setenv(f"MODELFLEET_DOUBLE_{name.upper()}", str(value))
    args = {"positional": ["/model"], "--served-model-name": served, **({"--api-key": key} if key else {})}
    handler = type("Handler", (engine_double.Handler,), {"eng": engine_double.Engine(engine, args),
                                                          "log_message": lambda *a: None})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    # a short poll: shutdown() waits for the loop to look again
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
