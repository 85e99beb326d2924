"""A marker key through a real run on the lab (three hosts, vLLM, SGLang and llama.cpp, every service keyed):
the SGLang double prints its server arguments, key included, as SGLang does; `modelfleet logs` shows that line
with the key masked; the run's output and reports hold neither the key nor the hub token; and on every host no
file that anyone may read holds either."""

import secrets
from pathlib import Path

import pytest

import lab
from lab import scenario
from modelfleet import REPO_ROOT
from modelfleet.base.commands import run_modelfleet, run_pyinfra

pytestmark = pytest.mark.lab

KEY = "MFMARK" + secrets.token_hex(12)
# Every file anyone may read: the root filesystem, and the host's model and config directories (mounts of their
# own in the lab, so named besides `/`).
WORLD_READABLE = ("{{ find / -xdev \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o -type f -perm -0004 "
                  "-size -64M -print0; find {2} {3} -type f -perm -0004 -size -64M -print0; }} 2>/dev/null "
                  "| xargs -0 -r grep -l -F -e {0} -e {1} 2>/dev/null; true")


@pytest.fixture(scope="module")
def served(lab_hosts, tmp_path_factory):
    reports = tmp_path_factory.mktemp("reports")
    env = {"LAB_API_KEY": KEY, "MODELFLEET_REPORTS": str(reports)}
    with scenario.applied(api_key_env="LAB_API_KEY"):
        run = run_pyinfra("inventories/lab.py", "deploys/serve.py", cwd=REPO_ROOT, env=env, timeout=600)
        logs = run_modelfleet("logs", "inventories/lab.py", "-n", "400", cwd=REPO_ROOT, env=env, timeout=120)
    hub_token = Path(lab.STATE / "hf-token").read_text().strip()
    return lab_hosts, run, logs, reports, hub_token


def test_run_output_and_reports_hold_no_secret(served):
    _, run, _, reports, hub_token = served
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert KEY not in run.stdout + run.stderr and hub_token not in run.stdout + run.stderr
    files = [p for p in reports.rglob("*") if p.is_file()]
    assert files
    for path in files:
        text = path.read_text(errors="replace")
        assert KEY not in text and hub_token not in text, path


def test_logs_mask_the_key_sglang_prints(served):
    specs, _, logs, _, _ = served
    assert logs.returncode == 0, logs.stderr[-2000:]
    sglang = next(s["name"] for s in specs if s["engine"] == "sglang")
    # the journal also holds the starts of earlier tests' engines, which ran without a key (api_key=None)
    lines = [line for line in logs.stdout.splitlines() if line.startswith(f"[{sglang}]") and "server_args=" in line
             and "api_key=None" not in line]
    assert lines, logs.stdout[-3000:]  # the line is there...
    assert all("api_key='********'" in line for line in lines), lines
    assert KEY not in logs.stdout + logs.stderr  # ...and the key is not
    on_host = lab.ssh(next(s for s in specs if s["name"] == sglang),
                      f"journalctl -u modelfleet-tiny-{sglang}.service --no-pager | grep -c {KEY}")
    assert int(on_host.stdout.strip() or 0) >= 1  # the engine did log it: the mask is what kept it out


def test_no_world_readable_file_on_a_host_holds_a_secret(served):
    specs, _, _, _, hub_token = served
    for spec in specs:
        found = lab.ssh(spec, WORLD_READABLE.format(KEY, hub_token, spec["config_dir"], spec["model_root"]),
                        timeout_s=300).stdout.split()
        assert found == [], (spec["name"], found)
        private = lab.ssh(spec, f"grep -rl -F {KEY} {spec['config_dir']} 2>/dev/null").stdout.split()
        assert private, "the key should be on the host, in its 0600 files"
