"""modelfleet installed from its wheel, run outside the checkout, and the control commands free of gevent."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # builds the wheel and installs it in a fresh environment


def run(bin_dir, work, *argv):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(bin_dir / argv[0]), *argv[1:]], cwd=work, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_wheel_validates_plans_and_renders_outside_the_checkout(installed):
    bin_dir, work = installed
    where = run(bin_dir, work, "python", "-c", "import modelfleet; print(modelfleet.__file__)")
    assert str(ROOT) not in where.stdout and "site-packages" in where.stdout, where.stdout + where.stderr
    validate = run(bin_dir, work, "modelfleet", "validate", "inventories/prod.py")
    assert validate.returncode == 0 and "ok: 4 host(s)" in validate.stdout, validate.stdout + validate.stderr
    plan = run(bin_dir, work, "modelfleet", "plan", "--model", "kimi-k3.1-pro", "--hardware", "b300", "--gpus", "8")
    assert plan.returncode == 0, plan.stderr
    render = run(bin_dir, work, "modelfleet", "render", "inventories/prod.py", "b300-01")
    assert render.returncode == 0, render.stderr
    assert "[Service]" in render.stdout and "ExecStart=" in render.stdout  # the shipped template
    # Every file of the package in the checkout is in the wheel (a file read at import time and left out of
    # package-data breaks every command of an installed modelfleet, not the checkout's).
    installed_root = run(bin_dir, work, "python", "-c", "import modelfleet, pathlib; "
                         "print(pathlib.Path(modelfleet.__file__).parent)").stdout.strip()
    tracked = subprocess.run(["git", "ls-files", "modelfleet"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    missing = [path for path in tracked if not os.path.exists(os.path.join(installed_root, path.split("/", 1)[1]))]
    assert missing == [], f"tracked but not installed (pyproject.toml's package-data): {missing}"
    lab = run(bin_dir, work, "modelfleet", "lab", "status")
    assert lab.returncode != 0 and "checkout" in lab.stderr  # the lab is not part of the package


def test_control_commands_load_inventories_without_gevent_patching():
    script = ("import sys, gevent.monkey\n"
              "from modelfleet.cli import main\n"
              "try:\n    main(['validate', 'inventories/prod.py'])\nexcept SystemExit as e:\n    code = e.code\n"
              "import json; print(json.dumps({'code': code, 'socket': gevent.monkey.is_module_patched('socket'),"
              " 'pyinfra_cli': 'pyinfra_cli' in sys.modules}))\n")
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result == {"code": 0, "socket": False, "pyinfra_cli": False}, run.stdout + run.stderr
