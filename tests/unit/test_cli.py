"""The command line as a package (modelfleet.cli): one `main` group gathering every group's commands, reached through
the `modelfleet` entry point (pyproject's scripts) and `python -m modelfleet.cli` alike. Each group's commands have
their tests beside their module (test_cli_views.py, test_cli_observe.py, test_cli_operate.py, test_cli_lab.py)."""

import subprocess
import sys
from importlib import import_module

import tomllib

from modelfleet import PACKAGE_DIR
from modelfleet.cli import main

COMMANDS = {"admit", "bench", "catalog", "converge", "cost", "drain", "lab", "logs", "mirror", "plan", "prometheus",
            "render", "retire", "show", "status", "tunnel", "undrain", "upgrade", "urls", "validate", "verify"}


def test_the_entry_point_is_the_one_group_with_every_command():
    scripts = tomllib.loads((PACKAGE_DIR.parent / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, name = scripts["modelfleet"].partition(":")
    assert getattr(import_module(module), name) is main
    assert set(main.commands) == COMMANDS and set(main.commands["lab"].commands) == {"up", "personas", "down",
                                                                                     "status"}


def test_python_dash_m_runs_the_same_command_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "modelfleet.cli", "--help"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    listed = {line.split()[0] for line in done.stdout.split("Commands:", 1)[1].splitlines() if line.strip()}
    assert listed == COMMANDS
    missing = subprocess.run([sys.executable, "-m", "modelfleet.cli", "validate", str(tmp_path / "none.py")],
                             capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert missing.returncode == 2 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr
