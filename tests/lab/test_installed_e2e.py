"""The installed wheel, outside the checkout, dry-runs the whole pipeline against lab hosts by module path."""

import os
import subprocess

import pytest

pytestmark = pytest.mark.lab


def test_the_wheel_dry_runs_serve_against_lab_hosts(installed, lab_hosts):
    bin_dir, work = installed
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([str(bin_dir / "python"), "-m", "pyinfra", "--dry", "inventories/lab.py",
                          "modelfleet.run.deploys.serve"], cwd=work, env=env, capture_output=True, text=True,
                         timeout=600)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert "Traceback" not in out
    for spec in lab_hosts:
        assert f"[{spec['name']}] Ready: serve" in out
    assert "modelfleet service | " in out and "modelfleet verify | " in out  # the stages were prepared


def test_the_wheel_runs_upgrade_by_module_path(installed, lab_hosts):
    """`modelfleet upgrade` names its deploys by module path: it runs from an installed package, no checkout."""
    import json

    bin_dir, work = installed
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    first = lab_hosts[0]["name"]
    run = subprocess.run([str(bin_dir / "modelfleet"), "upgrade", "inventories/lab.py", "-y", "--limit", first],
                         cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    report = json.loads(run.stdout)
    assert not report["stopped"] and [b["hosts"] for b in report["batches"]] == [[first]], report
