"""lab/replay.py: a simulated host answers as the recorded host did, read under its own name; a command or file
the recording lacks fails the run instead of passing as a no-op."""

import hashlib
import secrets
from types import SimpleNamespace

import pytest
from pyinfra.api.command import StringCommand

from lab import replay


def connector(name: str, answers: dict, contents: dict | None = None) -> replay.ReplayConnector:
    made = replay.ReplayConnector.__new__(replay.ReplayConnector)
    made.host = SimpleNamespace(name=name)
    replay.ReplayConnector.answers, replay.ReplayConnector.contents = answers, contents or {}
    return made


def test_a_copy_answers_as_the_recorded_host_under_its_own_name():
    unit = "[Service]\nExecStart=docker run --name modelfleet-tiny-h1-h1 img\n"
    digest = hashlib.sha256(unit.encode()).hexdigest()
    command = StringCommand("modelfleet-state /etc/systemd/system/modelfleet-tiny-h1.service /opt/bin")
    lines = [["stdout", "@@modelfleet-state path /etc/systemd/system/modelfleet-tiny-h1.service"],
             ["stdout", f"file 644 root root {digest}"],
             ["stdout", "@@modelfleet-state path /opt/bin/tool.py"],
             ["stdout", "file 755 root root " + "a" * 64]]
    answers = {"h0": {}, "h1": {replay.key("h1", command, {}): [True, lines]}}
    # sim-00001 copies recorded host 1 of 2 (in name order): its command names itself where h1's named h1.
    copy = connector("sim-00001", answers, {"h1": {"/etc/systemd/system/modelfleet-tiny-h1.service": unit}})
    ok, output = copy.run_shell_command(
        StringCommand("modelfleet-state /etc/systemd/system/modelfleet-tiny-sim-00001.service /opt/bin"))
    assert ok
    got = [line.line for line in output.combined_lines]
    assert got[0] == "@@modelfleet-state path /etc/systemd/system/modelfleet-tiny-sim-00001.service"
    # The unit's digest is that of the unit as the copy holds it (its own name in it), the tool's unchanged.
    mine = hashlib.sha256(unit.replace("h1", "sim-00001").encode()).hexdigest()
    assert got[1] == f"file 644 root root {mine}" and got[3] == "file 755 root root " + "a" * 64


def test_a_command_or_file_the_recording_lacks_fails():
    copy = connector("sim-00000", {"h0": {}})
    ok, output = copy.run_shell_command(StringCommand("systemctl restart modelfleet-tiny-sim-00000"))
    assert not ok and "not in the recording" in output.combined_lines[0].line
    # The same text under other connector arguments (sudo) is another command.
    command = StringCommand("id -u")
    copy = connector("sim-00000", {"h0": {replay.key("h0", command, {}): [True, [["stdout", "0"]]]}})
    assert copy.run_shell_command(command)[0]
    assert not copy.run_shell_command(command, _sudo=True)[0]
    with pytest.raises(RuntimeError, match="takes no file"):
        copy.put_file("/tmp/x", "/etc/modelfleet/x")


def test_the_key_holds_no_command_text():
    secret = "hf_" + secrets.token_hex(16)
    assert secret not in replay.key("h0", StringCommand(f"echo {secret} > /etc/token"), {})
