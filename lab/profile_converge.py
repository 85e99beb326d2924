"""Where the control node's CPU goes in a no-op converge: `python -m lab.profile_converge [HOSTS] [OUT]`.

Brings the lab to HOSTS hosts (default 16), converges them once, then runs the same pyinfra command twice more
under cProfile with a CPU clock (time.process_time, so the time a greenlet waits on the network is not counted):
serve.py, and stock pyinfra's no-op deploy with as many operations per host (lab/stock_noop_deploy.py, as
`make bench-converge` compares them). Prints, for each, the CPU seconds per host split by component (pyinfra
itself by part, paramiko and the crypto under it, gevent, modelfleet by module, the rest) and the top 30
functions by their own time; OUT (default reports/profile-converge) gets the pstats files.

A function of the standard library or a C built-in has no component of its own: its time goes to the callers
that called it, in proportion to what each spent in it, up to the first caller that belongs to a component.
"""

from __future__ import annotations

import io
import json
import os
import pstats
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import lab
from lab.bench_converge import STOCK_DEPLOY, converge
from modelfleet.base.commands import pyinfra_argv

STDLIB = sysconfig.get_paths()["stdlib"]
# cProfile around pyinfra's own entry point, on the CPU clock; argv: OUT, then pyinfra's arguments.
RUNNER = """
import cProfile, sys, time
out = sys.argv[1]
sys.argv = ["pyinfra", *sys.argv[2:]]
from pyinfra_cli.main import main
profile = cProfile.Profile(time.process_time)
try:
    profile.runcall(main)
except SystemExit as exit:
    code = exit.code
else:
    code = 0
profile.dump_stats(out)
sys.exit(code)
"""

PYINFRA_PARTS = (  # pyinfra's own files -> the part of its work they do
    ("pyinfra_cli/", "pyinfra CLI (loading, output)"),
    ("pyinfra/api/operation", "pyinfra operations (planning)"),
    ("pyinfra/api/arguments", "pyinfra global arguments"),
    ("pyinfra/api/facts", "pyinfra facts"),
    ("pyinfra/facts/", "pyinfra facts"),
    ("pyinfra/api/operations", "pyinfra execution"),
    ("pyinfra/api/command", "pyinfra commands"),
    ("pyinfra/connectors/", "pyinfra SSH connector"),
    ("pyinfra/operations/", "pyinfra operation modules"),
    ("pyinfra/", "pyinfra other (state, host, util, logging)"),
)


def component(filename: str) -> str | None:
    """The component a function's file belongs to; None for the standard library and built-ins."""
    if filename.startswith("~") or filename.startswith("<") or filename.startswith(STDLIB + "/") \
            and "site-packages" not in filename:
        return None
    for part, name in PYINFRA_PARTS:
        if f"/{part}" in filename:
            return name
    if "/modelfleet/" in filename:
        module = filename.split("/modelfleet/", 1)[1].removesuffix(".py").replace("/", ".")
        return f"modelfleet.{module}"
    for package, name in (("paramiko", "paramiko"), ("cryptography", "crypto (cryptography, nacl, bcrypt)"),
                          ("nacl", "crypto (cryptography, nacl, bcrypt)"),
                          ("bcrypt", "crypto (cryptography, nacl, bcrypt)"),
                          ("gevent", "gevent"), ("greenlet", "gevent"), ("click", "click"), ("jinja2", "jinja2"),
                          ("yaml", "yaml"), ("pydantic", "pydantic"), ("typeguard", "typeguard")):
        if f"/site-packages/{package}/" in filename or f"/site-packages/_{package}" in filename:
            return name
    if "/site-packages/" in filename:
        return "other packages: " + filename.split("/site-packages/", 1)[1].split("/", 1)[0]
    if "/deploys/" in filename or "/inventories/" in filename or "/lab/" in filename:
        return "deploy and inventory files"
    return "other"


def split(stats: pstats.Stats) -> dict[str, float]:
    """CPU seconds by component: each function's own time, a standard-library or built-in function's passed up
    to its callers in proportion to the time each spent in it."""
    raw = stats.stats  # func -> (cc, nc, tt, ct, callers{func: (cc, nc, tt, ct)})
    shares: dict[tuple, dict[str, float]] = {}  # func -> {component: fraction of its time}

    def share(func, seen: frozenset) -> dict[str, float]:
        name = component(func[0])
        if name is not None:
            return {name: 1.0}
        if func in shares:
            return shares[func]
        callers = raw[func][4] if func in raw else {}
        weight = sum(c[3] for c in callers.values())
        if func in seen or not callers or weight <= 0:
            return {"standard library and built-ins, no caller found": 1.0}
        out: dict[str, float] = {}
        for caller, c in callers.items():
            for name, fraction in share(caller, seen | {func}).items():
                out[name] = out.get(name, 0.0) + fraction * c[3] / weight
        shares[func] = out
        return out

    totals: dict[str, float] = {}
    for func, (_, _, tt, _, _) in raw.items():
        if tt:
            for name, fraction in share(func, frozenset()).items():
                totals[name] = totals.get(name, 0.0) + tt * fraction
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def profiled(out: Path, deploy: str, names: list[str], env: dict | None = None) -> Path:
    argv = pyinfra_argv("inventories/lab.py", deploy, limit=names)
    run = subprocess.run([sys.executable, "-c", RUNNER, str(out), *argv[3:]], env={**os.environ, **(env or {})},
                         capture_output=True, text=True, timeout=900)
    total = re.search(r"Grand total\s+(\d+)\s+(\S+)", run.stdout + run.stderr)
    if run.returncode or not total or total.group(2) != "-":
        sys.exit(f"{deploy}: not a no-op run\n" + (run.stdout + run.stderr)[-4000:])
    return out


def summary(title: str, path: Path, hosts: int) -> str:
    top = io.StringIO()
    stats = pstats.Stats(str(path), stream=top)
    total = stats.total_tt
    lines = [f"== {title}: {total:.2f} CPU s profiled, {total / hosts:.4f} s per host ({hosts} hosts)", "",
             "component                                         CPU s   per host   share"]
    for name, seconds in split(stats).items():
        lines.append(f"{name:48s} {seconds:7.2f}   {seconds / hosts:.4f}   {seconds / total:6.1%}")
    stats.strip_dirs().sort_stats("tottime").print_stats(30)
    body = top.getvalue()
    lines += ["", "top 30 functions by own CPU time:", body[body.index("   ncalls"):].rstrip(), ""]
    return "\n".join(lines)


def main() -> None:
    hosts = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "reports/profile-converge")
    out.mkdir(parents=True, exist_ok=True)
    names = [spec["name"] for spec in lab.up(hosts)]  # a larger lab keeps its other hosts: left out here
    converge(names)  # the first converge installs units and starts engines; the profiled runs change nothing
    ops = converge(names)["operations_per_host"]
    stock_env = {"MODELFLEET_BENCH_OPS": str(ops)}
    converge(names, deploy=STOCK_DEPLOY, env=stock_env)
    ours = profiled(out / "serve.pstats", "deploys/serve.py", names)
    stock = profiled(out / "stock.pstats", STOCK_DEPLOY, names, stock_env)
    print(summary(f"modelfleet serve.py no-op converge, {ops} operations per host", ours, hosts))
    print(summary(f"stock pyinfra, {ops} no-op operations per host", stock, hosts))
    ours_s, stock_s = pstats.Stats(str(ours)).total_tt, pstats.Stats(str(stock)).total_tt
    print(json.dumps({"hosts": hosts, "operations_per_host": ops,
                      "modelfleet_cpu_s_per_host": round(ours_s / hosts, 4),
                      "stock_pyinfra_cpu_s_per_host": round(stock_s / hosts, 4), "ratio": round(ours_s / stock_s, 3)}))


if __name__ == "__main__":
    main()
