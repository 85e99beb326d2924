"""GPU admission on the lab (#16): the recorded H200 and the synthetic 8-GPU B300 and MI355X are admitted; each fault
persona (lab/personas/faults.yaml: one of them with one fault, as a real host reports it) is refused by
exactly the check for its fault, all within 60 s (the hosts are judged at once), `status` shows the verdicts,
and serve.py starts nothing on a refused host."""

import json
import os
import time

import pytest

import lab
from modelfleet import REPO_ROOT
from modelfleet.base.commands import run_modelfleet, run_pyinfra

pytestmark = pytest.mark.lab

# fault persona -> the one check admission must fail on it
FAULTS = {"h200x1-ecc": "ecc_volatile_uncorrectable", "h200x1-xid79": "xid", "h200x1-pcie-x8": "pcie_width",
          "h200x1-throttled": "clock_slowdown", "h200x1-persistence-off": "persistence_mode",
          "b300x8-nvlink-down": "nvlink_inactive", "b300x8-nvlink-replay": "nvlink_errors",
          "b300x8-fabric-in-progress": "fabric_state",
          "b300x8-gpu-missing": "preflight",  # preflight counts the GPUs first and stops the host there
          "mi355x8-ecc": "ecc_uncorrectable", "mi355x8-ras-fault": "amdgpu_fault"}
# the healthy 8-GPU boards the b300x8 and mi355x8 faults are edits of (admitted like the recorded H200)
HEALTHY_BOARDS = ["b300x8-synthetic", "mi355x8-synthetic"]


@pytest.fixture(scope="module")
def judged(lab_hosts, tmp_path_factory):
    personas = [s["persona"] for s in lab_hosts] + [*HEALTHY_BOARDS, *FAULTS]
    started = lab.up(len(personas), personas=personas, disks=1)[len(lab_hosts):]
    boards, faulty = started[:len(HEALTHY_BOARDS)], started[len(HEALTHY_BOARDS):]
    healthy = lab_hosts[0]
    env = {**os.environ, "MODELFLEET_REPORTS": str(tmp_path_factory.mktemp("reports"))}
    with lab.scenario.applied(only=[healthy["name"], *(s["name"] for s in started)]):
        started_at = time.monotonic()
        admit = run_modelfleet("admit", "inventories/lab.py", env=env, cwd=REPO_ROOT, timeout=600)
        admit_s = time.monotonic() - started_at
        status = run_modelfleet("status", "inventories/lab.py", "--json", env=env, cwd=REPO_ROOT, timeout=120)
    # DCGM's diagnostic at level 1: the H200 passes, the DCGM fault persona fails its memory test, and the B300
    # board (no dcgmi recorded) is refused for lacking dcgmi
    dcgm_fault = lab.up(len(personas) + 1, personas=personas + ["h200x1-dcgm-memory"], disks=1)[-1]
    with lab.scenario.applied(dcgm_level=1, only=[healthy["name"], dcgm_fault["name"], boards[0]["name"]]):
        dcgm = run_modelfleet("admit", "inventories/lab.py", env=env, cwd=REPO_ROOT, timeout=600)
    xid_host = next(s for s in faulty if s["persona"] == "h200x1-xid79")
    with lab.scenario.applied(only=[xid_host["name"]]):
        serve = run_pyinfra("inventories/lab.py", "deploys/serve.py", cwd=REPO_ROOT, timeout=600, env=env)
    yield {"admit": admit, "admit_s": admit_s, "dcgm": dcgm, "dcgm_fault": dcgm_fault, "status": status, "serve": serve,
           "healthy": healthy, "boards": boards, "faulty": faulty, "xid_host": xid_host}
    lab.remove([s["name"] for s in started] + [dcgm_fault["name"]])


def test_the_recorded_h200_is_admitted_and_each_fault_is_refused_by_its_own_check(judged):
    admit = judged["admit"]
    reports = {r["host"]: r for r in json.loads(admit.stdout)}
    assert admit.returncode == 1, admit.stderr[-3000:]  # at least one host refused
    for healthy in (judged["healthy"], *judged["boards"]):
        assert reports[healthy["name"]]["ok"], reports[healthy["name"]]["reasons"]
    for spec in judged["faulty"]:
        report = reports[spec["name"]]
        if FAULTS[spec["persona"]] == "preflight":
            assert report["refused_by"] == "preflight", report
            assert "GPU count: inventory says 8x b300, host has 7" in report["reasons"], report
            continue
        failed = [c["check"] for c in report["checks"] if not c["ok"]]
        assert not report["ok"] and failed == [FAULTS[spec["persona"]]], (spec["persona"], report["reasons"])
    assert judged["admit_s"] < 60, judged["admit_s"]
    xid = reports[judged["xid_host"]["name"]]
    assert "Xid 79" in xid["reasons"][0] and "fallen off the bus" in xid["reasons"][0]
    replay = reports[next(s["name"] for s in judged["faulty"] if s["persona"] == "b300x8-nvlink-replay")]
    assert replay["reasons"][0].startswith("GPU 0 NVLink link 5: 37 Replay Errors since the driver loaded"), replay
    # the CRC count beside it is recorded, not refused (DCGM judges CRC by a rate one reading lacks)
    assert replay["nvlink_errors"] == [{"gpu": 0, "link": 5, "counter": "CRC Errors", "value": 1204},
                                       {"gpu": 0, "link": 5, "counter": "Replay Errors", "value": 37}]
    assert all(reports[b["name"]]["nvlink_errors"] == [] for b in judged["boards"])


def test_dcgm_diagnostic_by_setting(judged):
    reports = {r["host"]: r for r in json.loads(judged["dcgm"].stdout)}
    healthy, fault, board = judged["healthy"]["name"], judged["dcgm_fault"]["name"], judged["boards"][0]["name"]
    assert reports[healthy]["ok"] and any(c["check"] == "dcgm_diag" for c in reports[healthy]["checks"])
    assert reports[fault]["reasons"] == [
        "DCGM diagnostic level 1 failed: memory (GPU 0: Memory error detected (lab fault persona))"]
    assert reports[board]["reasons"] == [
        "admission_dcgm_level is 1 but the host has no dcgmi (install DCGM, or set 0)"]


def test_status_shows_each_hosts_verdict(judged):
    rows = {r["host"]: r for r in json.loads(judged["status"].stdout)}
    assert rows[judged["healthy"]["name"]]["admission"]["valid"]
    replay = next(s["name"] for s in judged["faulty"] if s["persona"] == "b300x8-nvlink-replay")
    record = rows[replay]["record"]["admission"]  # the host record names the link and counter
    assert {"gpu": 0, "link": 5, "counter": "Replay Errors", "value": 37} in record["nvlink_errors"], record
    # a host preflight stopped was never judged by admission: no verdict, so never admitted
    assert all(not (rows[s["name"]]["admission"] or {}).get("ok") for s in judged["faulty"])


def test_serve_starts_nothing_on_a_refused_host(judged):
    serve, spec = judged["serve"], judged["xid_host"]
    assert serve.returncode != 0
    assert "admission: Xid 79" in serve.stdout + serve.stderr
    unit = f"modelfleet-tiny-{spec['name']}.service"
    assert lab.ssh(spec, f"systemctl is-active {unit}").stdout.strip() in ("inactive", "unknown")
    assert lab.ssh(spec, f"test -e /etc/systemd/system/{unit} && echo written").stdout.strip() == ""
