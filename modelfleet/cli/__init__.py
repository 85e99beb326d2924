"""modelfleet command line: validate, plan, render, admit, converge, verify, bench, cost, status, logs, tunnel,
prometheus, mirror, urls, retire, drain, undrain (and the lab). One module per command group, each registering
its commands on the one `main` group of modelfleet.cli.common: views (what the inventory says), observe (what
the hosts do), operate (what changes them), lab. The entry point is `modelfleet.cli:main`; `python -m
modelfleet.cli` runs it too."""

from modelfleet.cli import lab, observe, operate, views  # noqa: F401  (importing them registers their commands)
from modelfleet.cli.common import main

__all__ = ["main"]
