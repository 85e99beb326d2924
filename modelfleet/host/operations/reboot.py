"""Reboot a host and wait until it is back: confirmed by a new boot, not by uptime.

pyinfra's server.reboot compares /proc/uptime, which a container shares with its machine (the lab) and
which says nothing when a reboot is quick. The boot id changes on every kernel boot, and PID 1's start time
on every init start (a lab host's container restart): either one changing is a reboot.
"""

from __future__ import annotations

import shlex
import time

from pyinfra import host as this_host
from pyinfra import logger
from pyinfra.api import FunctionCommand, StringCommand, operation

from modelfleet.base.host_commands import boot_token_sh


def boot_token(host) -> str | None:
    ok, output = host.run_shell_command(StringCommand(boot_token_sh()), print_output=False)
    return " ".join(output.stdout_lines) if ok else None


@operation(is_idempotent=False)
def reboot_and_wait(needed: bool, reason: str, check_command: str | None = None, timeout_s: int = 900):
    """
    Reboot when `needed` (run it with `_serial=True`: one host at a time), wait for SSH and a new boot,
    then run `check_command` (e.g. nvidia-smi answers) before the run goes on.
    """
    if not needed:
        this_host.noop(f"no reboot needed ({reason})")
        return
    before: list[str | None] = []

    def capture(state, host):
        before.append(boot_token(host))
        return before[0] is not None

    def wait(state, host):
        deadline = time.monotonic() + timeout_s
        time.sleep(2)
        host.disconnect()
        while time.monotonic() < deadline:
            host.connect(show_errors=False)
            if host.connected:
                now = boot_token(host)
                if now and now != before[0]:
                    break
                host.disconnect()
            time.sleep(2)
        else:
            host.log_styled(f"did not come back from reboot within {timeout_s} s", fg="red", log_func=logger.error)
            return False
        host.log_styled(f"rebooted ({reason})", fg="yellow", log_func=logger.info)
        if check_command:
            ok, output = host.run_shell_command(StringCommand("sh", "-c", shlex.quote(check_command)),
                                                print_output=False)
            if not ok:
                for line in output.output_lines[-10:]:
                    host.log_styled(f"after reboot: {line}", fg="red", log_func=logger.error)
                return False
        return True

    yield FunctionCommand(capture, (), {})
    yield StringCommand("sh", "-c", shlex.quote("( sleep 1 && systemctl reboot ) </dev/null >/dev/null 2>&1 &"))
    yield FunctionCommand(wait, (), {})
