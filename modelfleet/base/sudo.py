"""pyinfra's sudo with a password reads it from stdin, never from the remote command line.

pyinfra 3.10 runs `env SUDO_ASKPASS=... PYINFRA_SUDO_PASSWORD=<password> sudo -H -A -k sh -c '...'` on the host:
the password sits in the argv of the user's shell and of `env`, which every local user reads in /proc/*/cmdline.
Installed into a pyinfra run (masking.install), the SSH and local connectors instead run
`sudo -H -S -k --prompt= sh -c '...'` and send the password as the first line of the command's stdin (before any
stdin of its own). Where sudo asks no password of the user (NOPASSWD; asked once per host and sudo user, for
`sh` as every command runs), plain `sudo -n` runs and nothing is sent: the line would reach the command itself.
A password pyinfra prompts for (none given, sudo asked) goes the same way.
"""

from __future__ import annotations

import shlex
from getpass import getpass
from typing import Any

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.exceptions import PyinfraError
from pyinfra.connectors import local, ssh, util

STDIN = "_modelfleet_sudo_stdin"  # passed from run_shell_command to the command builder beside pyinfra's own
PROMPTED = "prompted_sudo_password"  # where pyinfra keeps a password it prompted for (host.connector_data)


def _password(host, arguments: dict[str, Any]) -> str | None:
    if not arguments.get("_sudo"):
        return None
    return arguments.get("_sudo_password") or host.connector_data.get(PROMPTED) or None


def _lines(stdin) -> list:
    """A `_stdin` value as pyinfra's write_stdin takes it."""
    if stdin is None:
        return []
    if hasattr(stdin, "readlines"):
        stdin = stdin.readlines()
    return list(stdin) if isinstance(stdin, (list, tuple)) else [stdin]


def reading_stdin(command: StringCommand) -> StringCommand:
    """pyinfra's `sudo -H -n ...` made `sudo -H -S -k --prompt= ...`: the password from stdin, no prompt printed,
    no cached credential used."""
    bits = list(command.bits)
    for i in range(len(bits) - 2):
        if bits[i:i + 3] == ["sudo", "-H", "-n"]:
            bits[i + 2:i + 3] = ["-S", "-k", "--prompt="]
            return StringCommand(*bits, _separator=command.separator)
    raise PyinfraError(f"modelfleet: no `sudo -H -n` in pyinfra's command to give the password on stdin: {command}")


def asks(connector, user: str | None) -> bool:
    """Whether sudo asks this host's SSH user a password for `sh` (as every command runs) as `user` (None: root);
    asked once per host and user."""
    key = f"modelfleet_sudo_asks__{user or ''}"
    if key not in connector.host.connector_data:
        probe = StringCommand("sudo", "-H", "-n", "-k", *(["-u", QuoteString(user)] if user else []),
                              "sh", "-c", "true")
        ok, _ = connector.run_shell_command(probe)  # no _sudo argument: run as it is
        connector.host.connector_data[key] = not ok
    return connector.host.connector_data[key]


def prefix(host) -> tuple[list[str], str | None]:
    """For a program modelfleet runs on its own SSH channel (the run lock's holder): the words that make it root
    where the run reaches root through sudo (host data `_sudo`), and the password to send as the first line of
    its stdin (None: none)."""
    config = getattr(host.state, "config", None)

    def setting(key: str):  # host data, else the run's config (pyinfra's --sudo, --sudo-user, --sudo-password)
        value = host.data.get(f"_{key}")
        return value if value is not None else getattr(config, key.upper(), None)

    if not setting("sudo"):
        return [], None
    user = setting("sudo_user")
    words = ["sudo", "-H", *(["-u", shlex.quote(user)] if user else [])]
    password = setting("sudo_password") or host.connector_data.get(PROMPTED)
    if password and asks(host.connector, user):
        return [*words, "-S", "-k", "--prompt="], password
    return [*words, "-n"], None


def _patch(module) -> None:
    connector = module.LocalConnector if module is local else module.SSHConnector
    make_command, run = module.make_unix_command_for_host, connector.run_shell_command

    def make_unix_command_for_host(state, host, command, **arguments):
        if not arguments.pop(STDIN, False):
            return make_command(state, host, command, **arguments)
        prompted = host.connector_data.pop(PROMPTED, None)  # else pyinfra would use it through askpass
        try:
            return reading_stdin(make_command(state, host, command, **arguments))
        finally:
            if prompted is not None:
                host.connector_data[PROMPTED] = prompted

    def run_shell_command(self, command, print_output=False, print_input=False, **arguments):
        password = _password(self.host, arguments)
        if not password:
            ok, output = run(self, command, print_output, print_input, **arguments)
            if arguments.get("_sudo") and not ok and any(
                    line.line.strip() in util.SUDO_PASSWORD_REQUIRED_LINES for line in output.combined_lines):
                self.host.connector_data[PROMPTED] = getpass(f"{self.host.print_prefix}sudo password: ")
                return run_shell_command(self, command, print_output, print_input, **arguments)
            return ok, output
        arguments = {**arguments, "_sudo_password": ""}  # pyinfra builds `sudo -H -n`: nothing secret on the line
        if not asks(self, arguments.get("_sudo_user")):
            return run(self, command, print_output, print_input, **arguments)
        if arguments.get("_get_pty"):
            raise PyinfraError("modelfleet: a sudo password with _get_pty: a terminal would echo the password")
        arguments["_stdin"] = [password, *_lines(arguments.get("_stdin"))]
        return run(self, command, print_output, print_input, **arguments, **{STDIN: True})

    module.make_unix_command_for_host = make_unix_command_for_host
    # pyinfra's own retry would prompt and then put the password on the command line: run_shell_command retries.
    module.execute_command_with_sudo_retry = lambda host, arguments, execute: execute()
    module._modelfleet_run = run
    connector.run_shell_command = run_shell_command


def install() -> None:
    """From now on in this process, pyinfra's SSH and local connectors give sudo its password on stdin."""
    for module in (ssh, local):
        if not getattr(module, "_modelfleet_run", None):
            _patch(module)
