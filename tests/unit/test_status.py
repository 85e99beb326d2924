"""`modelfleet status`'s one remote command, run in a real shell with nvidia-smi answering: every section
parses, the GPUs included."""

import os
import stat
import subprocess

from modelfleet.fleet.status import parse_status, status_script
from modelfleet.plan.inventory import open_inventory


def test_status_script_lists_the_gpus_after_the_host_section(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, 100, 143771'\necho '1, 5, 143771'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    plan = open_inventory("inventories/prod.py").hosts["b300-01"]
    out = subprocess.run(["sh", "-c", status_script(plan)], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"}).stdout
    status = parse_status(out)
    assert status["gpus"] == [{"index": 0, "memory_used_mib": 100, "memory_total_mib": 143771},
                              {"index": 1, "memory_used_mib": 5, "memory_total_mib": 143771}]
    assert status["host"]["boot"] and "@@" not in status["host"]["boot"]
