"""Endpoint watcher for rollouts, run as its own process (the CLI process carries pyinfra's gevent patches,
under which a polling thread does not get scheduled while a subprocess runs).

    python -m modelfleet.watch TARGETS.json LOG    # TARGETS: {host: [url, bearer key or null]}

Every 0.5 s it asks each URL; each answer is a line `<unix time> <host> ok|fail` in LOG. It stops on SIGTERM.
"""

from __future__ import annotations

import json
import signal
import sys
import time
import urllib.error
import urllib.request


def main(targets_path: str, log_path: str, interval_s: float = 0.5) -> None:
    with open(targets_path) as f:
        targets = json.load(f)
    running = [True]
    signal.signal(signal.SIGTERM, lambda *_: running.__setitem__(0, False))
    with open(log_path, "a", buffering=1) as log:
        while running[0]:
            for host, (url, key) in targets.items():
                request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
                try:
                    with urllib.request.urlopen(request, timeout=2) as response:
                        response.read()
                    log.write(f"{time.time():.3f} {host} ok\n")
                except (urllib.error.URLError, OSError):
                    log.write(f"{time.time():.3f} {host} fail\n")
            time.sleep(interval_s)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
