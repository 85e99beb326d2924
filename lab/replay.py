"""A fleet of recorded hosts for the control node's scale: pyinfra runs against hosts that answer from a recording.

`record`: one pyinfra run over SSH against real lab hosts, with every command the SSH connector sends and what
came back (exit status, stdout and stderr lines) written to a recording (JSON, mode 0600: a host's output may
name what it holds). `run`: the same deploy against N hosts named `sim-<i>`, each with the data of the
recorded host it copies, through `ReplayConnector`: a command is answered with what the recorded host answered
to the same command (the simulated host's name read as the recorded one's); a command the recording lacks
fails (exit 1 and a line naming it), so a simulated run that strays from the recorded one cannot pass.

What this measures is the control node alone (pyinfra, modelfleet, the inventory, reports): no SSH, no network
latency, no host work. It does not stand in for a host's state changing: a recording of a no-op converge
replays a no-op converge.

Both go through pyinfra's own CLI (`pyinfra_cli.main.main`) in a child process (RUNNER); in a replay that
process's plain host names get the replay connector instead of SSH; nothing is installed as an entry point
(lab/ is not shipped).
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from pyinfra.connectors.base import BaseConnector
from pyinfra.connectors.util import CommandOutput, OutputLine

# argv: MODE (record|replay), RECORDING, then pyinfra's arguments.
# This file is loaded by its path, as MODULE, not through the lab package (whose import would be counted).
MODULE = "modelfleet_lab_replay"
RUNNER = f"""
import importlib.util, sys
mode, recording, path = sys.argv[1:4]
sys.argv = ["pyinfra", *sys.argv[4:]]
spec = importlib.util.spec_from_file_location("{MODULE}", path)
replay = sys.modules["{MODULE}"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(replay)
replay.install(mode, recording)
from pyinfra_cli.main import main
main()
"""
# Connector arguments that change what a host runs, beside the command's text.
KEYED_ARGUMENTS = ("_sudo", "_sudo_user", "_su_user", "_doas", "_doas_user", "_env", "_chdir", "_shell_executable",
                   "_use_sudo_password", "_stdin")


def key(host_name: str, command, arguments: dict) -> str:
    """What a command is looked up by: a digest of its text and the arguments that change it, with the host's
    name taken out (so a recording of one host answers for its copies). A digest, so no secret a command
    carries is written to the recording."""
    text = command.get_raw_value() if hasattr(command, "get_raw_value") else str(command)
    text = text.replace(host_name, "\0HOST\0")
    extra = {name: repr(arguments.get(name)) for name in KEYED_ARGUMENTS if arguments.get(name) is not None}
    return hashlib.sha256(json.dumps([text, extra], sort_keys=True).encode()).hexdigest()


def recorded_host(recorded: list[str], name: str) -> str:
    """The recorded host that simulated host `sim-<i>` copies."""
    return recorded[int(name.removeprefix("sim-")) % len(recorded)]


class ReplayConnector(BaseConnector):
    """Host `sim-<i>`: answers each command from the recording as recorded host i mod R (in name order)
    answered it, as lab/replay_inventory.py copies that host's data."""

    handles_execution = True
    answers: dict[str, dict[str, list]] = {}  # recorded host -> command key -> [ok, [[buffer, line], ...]]
    contents: dict[str, dict[str, str]] = {}  # recorded host -> path -> content of a file that names the host

    @staticmethod
    def make_names_data(name=None):
        raise SystemExit("a replayed host is named plainly (sim-<i>), not @replay/")

    def run_shell_command(self, command, print_output=False, print_input=False, **arguments):
        name = self.host.name
        of = recorded_host(sorted(self.answers), name)
        found = self.answers[of].get(key(name, command, arguments))
        if found is None:
            return False, CommandOutput([OutputLine("stderr", f"not in the recording: {command}")])
        ok, lines = found
        return ok, CommandOutput(list(answer(lines, of, name, self.contents.get(of, {}))))

    def put_file(self, filename_or_io, remote_filename, *args, **kwargs) -> bool:
        raise RuntimeError(f"{self.host.name}: a replayed host takes no file ({remote_filename}): the recorded "
                           "run sent none, so this run is not the recorded one")

    def get_file(self, remote_filename, filename_or_io, *args, **kwargs) -> bool:
        raise RuntimeError(f"{self.host.name}: a replayed host gives no file ({remote_filename})")


STATE_PATH = "@@modelfleet-state path "


def answer(lines: list, of: str, name: str, contents: dict[str, str]):
    """The recorded output lines as host `name` gives them: `of` read as `name`, and the digest of a file whose
    content names the host (modelfleet's state read: a `file MODE OWNER GROUP SHA256` line after its path)
    made from that content as `name` holds it."""
    path = None
    for buffer, line in lines:
        if line.startswith(STATE_PATH):
            path = line[len(STATE_PATH):]
        elif path in contents and line.startswith("file "):
            mode, owner, group = line.split()[1:4]
            digest = hashlib.sha256(contents[path].replace(of, name).encode()).hexdigest()
            line = f"file {mode} {owner} {group} {digest}"
        yield OutputLine(buffer, line.replace(of, name))


def install(mode: str, recording: str) -> None:
    """In pyinfra's process: record what the SSH connector gets (mode record, written at exit), or make
    plain host names resolve to ReplayConnector answering from the recording (mode replay)."""
    import atexit

    import pyinfra.api.inventory as inventory

    if mode == "replay":
        saved = json.loads(Path(recording).read_text())
        ReplayConnector.answers, ReplayConnector.contents = saved["hosts"], saved["contents"]
        # A plain name is pyinfra's SSH connector's: in this process it is the replay's, so a simulated host is
        # named as a real one is (its units and containers carry its name).
        execution = inventory.get_execution_connectors
        inventory.get_execution_connectors = lambda: {**execution(), "ssh": ReplayConnector}
        return
    from pyinfra.connectors.ssh import SSHConnector

    recorded: dict[str, dict[str, list]] = {}
    send = SSHConnector.run_shell_command

    def recording_send(self, command, print_output=False, print_input=False, **arguments):
        command_key = key(self.host.name, command, arguments)
        ok, output = send(self, command, print_output, print_input, **arguments)
        recorded.setdefault(self.host.name, {})[command_key] = [
            ok, [[line.buffer_name, line.line] for line in output.combined_lines]]
        return ok, output

    def write() -> None:
        fd = os.open(recording, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({"hosts": recorded}, out)

    SSHConnector.run_shell_command = recording_send
    atexit.register(write)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def pyinfra(mode: str, recording: Path, inventory: str, deploy: str, env: dict | None = None,
            limit: list[str] = (), extra: list[str] = ()) -> dict:
    """One pyinfra run through RUNNER: wall and CPU seconds (user + sys of the child), exit status, output."""
    from modelfleet.base.commands import pyinfra_argv

    pyinfra_args = pyinfra_argv(inventory, deploy, limit=list(limit), extra=extra)[3:]  # from "-y" on
    cpu, start = cpu_seconds(), time.perf_counter()
    run = subprocess.run([sys.executable, "-c", RUNNER, mode, str(recording), __file__, *pyinfra_args],
                         capture_output=True, text=True, env={**os.environ, **(env or {})})
    return {"wall_s": time.perf_counter() - start, "cpu_s": cpu_seconds() - cpu, "returncode": run.returncode,
            "output": run.stdout + run.stderr}


def naming_files(name: str, data: dict, answers: dict[str, list]) -> dict[str, str]:
    """The files of the host's state read whose content names the host (a unit, a job file with its paths),
    read from the host over SSH: a copy's digest of them differs from the recorded one's. Such a file may be
    one the host keeps 0600 (a job file, an env file): the recording is 0600 too, in the lab's state folder,
    beside the lab's own hub token."""
    wanted = []
    for _, lines in answers.values():
        path = None
        for _, line in lines:
            if line.startswith(STATE_PATH):
                path = line[len(STATE_PATH):]
            elif path and line.startswith("file "):
                wanted.append(path)
    contents = {}
    for path in wanted:
        read = subprocess.run(["ssh", "-i", data["ssh_key"], "-o", f"UserKnownHostsFile={data['ssh_known_hosts_file']}",
                               "-o", "BatchMode=yes", f"{data.get('ssh_user', 'root')}@{data['ssh_hostname']}",
                               "cat", "--", path], capture_output=True, timeout=60)
        text = read.stdout.decode(errors="replace")
        if read.returncode == 0 and name in text:
            contents[path] = text
    return contents


def record(recording: Path, inventory: str = "inventories/lab.py", deploy: str = "deploys/serve.py",
           env: dict | None = None, extra: list[str] = ()) -> dict:
    """Record a run of DEPLOY on every host of INVENTORY over SSH, with each host's inventory data (so the
    simulated inventory can copy it)."""
    import runpy

    run = pyinfra("record", recording, inventory, deploy, env=env, extra=extra)
    if run["returncode"]:
        raise SystemExit(f"the recorded run failed:\n{run['output'][-3000:]}")
    hosts = dict(runpy.run_path(inventory)["lab_hosts"])
    saved = json.loads(recording.read_text())
    saved["data"] = {name: hosts[name] for name in saved["hosts"]}
    saved["contents"] = {name: naming_files(name, hosts[name], saved["hosts"][name]) for name in saved["hosts"]}
    recording.write_text(json.dumps(saved))
    return run
