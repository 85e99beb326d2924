"""modelfleet.cli.common: the inventory options every command shares, and the usage errors that stop a command
before it connects anywhere."""

from __future__ import annotations

from tests.helpers.cli_runner import H200, inventory, run


def test_data_that_is_not_key_equals_value_is_a_usage_error(tmp_path):
    out = run("validate", inventory(tmp_path, {"g1": H200}), "--data", "reboot")
    assert out.exit_code == 2 and "reboot" in out.output and "Traceback" not in out.output
