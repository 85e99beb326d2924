"""The verify gate's client work in a child interpreter.

The verify stage runs inside pyinfra, whose CLI monkey-patches the process with gevent; the openai SDK's HTTP
stack (httpx, httpcore) imports trio where a user's environment has it, and trio does not import under those
patches. So the stage hands the endpoint to `python -m modelfleet.run.checks.gate` (one JSON request on stdin:
the API key never reaches an argv) and reads one JSON report back. The SSH tunnel to a loopback-bound endpoint
stays in the pyinfra process, on the host's own connection; the child talks to its local end.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from modelfleet.run.checks import Endpoint, ready


def run_gate(ep: Endpoint, ready_timeout_s: float, full: bool, bench: dict | None, bench_dir: Path) -> dict:
    """Readiness (and, when `full`, smoke and the tool probe; with `bench`, a short bench) of `ep`. Readiness
    alone needs only the standard library: asked here, with no child interpreter."""
    if not full and not bench:
        return ready.report(ep, ready_timeout_s)
    request = {"endpoint": asdict(ep), "ready_timeout_s": ready_timeout_s, "full": full, "bench": bench,
               "bench_dir": str(bench_dir)}
    budget = ready_timeout_s + 600  # the checks' own timeouts end far sooner; this only bounds a hung child
    try:
        run = subprocess.run([sys.executable, "-m", "modelfleet.run.checks.gate"], input=json.dumps(request),
                             capture_output=True, text=True, timeout=budget)
        if run.returncode == 0:
            return json.loads(run.stdout)
        error = (run.stderr.strip().splitlines() or [f"exit {run.returncode}"])[-1]
    except (subprocess.TimeoutExpired, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    return {"ok": False, "readiness": {"ok": False, "error": f"the check process failed: {error}"}}


def _child(request: dict) -> dict:
    # the openai SDK loads only here, in the child: it does not import under pyinfra's gevent patches
    from modelfleet.run.checks.bench import bench
    from modelfleet.run.checks.probe import verify

    ep = Endpoint(**request["endpoint"])
    report = verify(ep, request["ready_timeout_s"], request["full"])
    if request["bench"] and report["ok"]:
        result = bench(ep, out_dir=Path(request["bench_dir"]), **request["bench"])
        report["bench"] = {"json": result["json"], "plot": result["plot"], "regressions": result["regressions"]}
        report["ok"] = not result["regressions"]
    return report


if __name__ == "__main__":
    answer_to, sys.stdout = sys.stdout, sys.stderr  # anything the checks print must not corrupt the answer
    json.dump(_child(json.load(sys.stdin)), answer_to)
