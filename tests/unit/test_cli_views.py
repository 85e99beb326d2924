"""modelfleet.cli.views through click's runner: validate's report and exit codes, render's files with the key
masked, plan's usage errors."""

from __future__ import annotations

import json

from tests.helpers.cli_runner import H200, inventory, run
from tests.helpers.made_keys import made_key


def test_validate_says_ok_and_where_it_looked_for_group_data(tmp_path):
    inv = inventory(tmp_path, {"g1": H200, "g2": H200})
    out = run("validate", inv)
    assert out.exit_code == 0
    lines = out.output.splitlines()
    assert lines[0] == "ok: 2 host(s), 2 pool(s)"
    assert lines[-1].startswith("group_data read: none (looked in ") and str(tmp_path / "group_data") in lines[-1]
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "gpus.py").write_text("verify_full = True\n")
    assert run("validate", inv).output.splitlines()[-1] == f"group_data read: {tmp_path / 'group_data' / 'gpus.py'}"


def test_validate_reports_every_problem_at_once_and_exits_2(tmp_path):
    inv = inventory(tmp_path, {"g1": {**H200, "port": 0}, "g2": {**H200, "modle": "qwen3-8b"}})
    out = run("validate", "--json", inv)
    assert out.exit_code == 2
    report = json.loads(out.output)
    assert not report["ok"] and report["hosts"] == ["g1", "g2"]
    assert {(e["where"], e["field"]) for e in report["errors"]} == {("host g1", "port"), ("host g2", "modle")}


def test_render_prints_the_unit_and_env_file_with_the_key_masked(tmp_path, monkeypatch):
    key = made_key()
    monkeypatch.setenv("SITE_QWEN_KEY", key)
    inv = inventory(tmp_path, {"g1": {**H200, "api_key_env": "SITE_QWEN_KEY"}})
    out = run("render", "--json", inv, "g1")
    assert out.exit_code == 0, out.output
    files = {f["path"]: f for f in json.loads(out.output)["files"]}
    unit = next(p for p in files if p.startswith("/etc/systemd/system/"))
    assert files[unit]["mode"] == "0644" and "ExecStart=" in files[unit]["content"]
    assert all(f["mode"] == "0600" for p, f in files.items() if p != unit)
    assert key not in out.output
    text = run("render", inv, "g1").output
    assert key not in text and f"# ==> {unit}\n" in text


def test_render_of_a_host_the_inventory_lacks_names_the_hosts_it_has(tmp_path):
    out = run("render", inventory(tmp_path, {"g1": H200}), "g9")
    assert out.exit_code == 2 and "no host 'g9'" in out.output and "(hosts: g1)" in out.output


def test_plan_names_what_is_missing_or_unknown():
    assert "give INVENTORY HOST, or --model, --hardware and --gpus" in run("plan", "--model", "qwen3-8b").output
    out = run("plan", "--model", "no-such-model", "--hardware", "h200", "--gpus", "1")
    assert out.exit_code == 2 and "unknown model 'no-such-model' (known: " in out.output
