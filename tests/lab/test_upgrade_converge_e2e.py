"""After `modelfleet upgrade` (each batch a --limit run of its own), a plain converge of the same inventory
changes nothing: the batch runs leave each host as a full run would (downloader, hub token, units)."""

import json
import os
import re
import shlex
import signal
import subprocess
import time

import pytest

import lab
from modelfleet.base.commands import modelfleet_argv, run_modelfleet, run_pyinfra

pytestmark = pytest.mark.lab
BASE = {"engine": "vllm"}  # the scenario: vLLM on every host


def changed(run) -> int:
    total = re.search(r"Grand total\s+(\d+)\s+(\S+)", run.stdout + run.stderr)
    return 0 if total and total.group(2) == "-" else int(total.group(2)) if total else -1


def test_a_plain_converge_after_an_upgrade_changes_nothing(lab_hosts, scenario):
    scenario(**BASE)
    first = run_pyinfra("inventories/lab.py", "deploys/serve.py", timeout=1200)
    assert first.returncode == 0, first.stdout[-3000:]
    scenario(**BASE, image=lab.UPGRADE_IMAGE, revision="v1.0")
    upgrade = run_modelfleet("upgrade", "inventories/lab.py", "-y", "--min-healthy", "2", timeout=1200)
    report = json.loads(upgrade.stdout)
    assert upgrade.returncode == 0, report
    assert report["upgraded"] == [s["name"] for s in lab_hosts]
    tokens = [s["name"] for s in lab_hosts if lab.ssh(s, f"test -e {s['config_dir']}/hf-token && echo yes")
              .stdout.strip() == "yes"]
    assert tokens == [lab_hosts[0]["name"]], tokens  # the group's downloader only, as a full run leaves it
    converge = run_pyinfra("inventories/lab.py", "deploys/serve.py", timeout=1200)
    assert converge.returncode == 0 and changed(converge) == 0, converge.stdout[-4000:]


def test_an_interrupted_upgrade_says_where_it_stopped_and_its_command_finishes_it(lab_hosts, scenario):
    scenario(**BASE, image=lab.ENGINE_IMAGES[0])  # back to v0.34.0
    second = lab_hosts[1]["name"]
    upgrade = subprocess.Popen(modelfleet_argv("upgrade", "inventories/lab.py", "-y", "--min-healthy", "2"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    for line in upgrade.stderr:
        if f"batch ['{second}']: switch" in line:
            time.sleep(3)
            os.killpg(upgrade.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group
            break
    out, err = upgrade.communicate(timeout=300)
    assert upgrade.returncode == 1 and "Traceback" not in err, err[-3000:]
    report = json.loads(out)
    stopped = report["interrupted"]
    assert stopped["batch"] == 2 and stopped["hosts"] == [second] and stopped["step"] == "switch", report
    assert set(stopped["hosts_now"]) == {s["name"] for s in lab_hosts}
    assert f"finish with: {stopped['finish_with']}" in err
    assert stopped["finish_with"].startswith("modelfleet upgrade inventories/lab.py ")
    finish = run_modelfleet(*shlex.split(stopped["finish_with"])[1:], "-y", timeout=1200)  # no terminal to ask on
    assert finish.returncode == 0, finish.stdout[-3000:]
    converge = run_pyinfra("inventories/lab.py", "deploys/serve.py", timeout=1200)
    assert converge.returncode == 0 and changed(converge) == 0, converge.stdout[-4000:]
