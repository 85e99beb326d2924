"""SSH to one host with the inventory's own settings (ssh_hostname, ssh_port, ssh_user, ssh_key), checking its
key against the file pyinfra uses (ssh_known_hosts_file, else ~/.ssh/known_hosts). A changed key is always refused,
and so is an unknown one unless the host's `ssh_strict_host_key_checking` is `accept-new` (pyinfra's own setting;
`no`/`off` count as accept-new here, a changed key is still refused), which records it in that file: first contact
is an explicit choice. Day-two reads (fleet), the bench's GPU memory reader and the mirror connect through here."""

from __future__ import annotations

from pathlib import Path

import paramiko
from fabric import Connection

from modelfleet.base.errors import ModelfleetError
from modelfleet.plan.inventory.plan import HostPlan


class HostKeyError(ModelfleetError, paramiko.SSHException):
    pass


def known_hosts_file(plan: HostPlan) -> Path:
    return Path(plan.ssh_known_hosts_file or "~/.ssh/known_hosts").expanduser()


def _key_name(plan: HostPlan) -> str:
    """How known_hosts names the host: `[address]:port` off port 22, as OpenSSH writes it."""
    return plan.address if plan.ssh_port == 22 else f"[{plan.address}]:{plan.ssh_port}"


class _FirstContact(paramiko.MissingHostKeyPolicy):
    """An unknown key: refused, or recorded when the inventory opts in (accept-new)."""

    def __init__(self, plan: HostPlan):
        self.plan = plan

    def missing_host_key(self, client, hostname, key):
        path = known_hosts_file(self.plan)
        if self.plan.ssh_strict_host_key_checking not in ("accept-new", "no", "off"):
            raise HostKeyError(
                f"{self.plan.name}: host key of {_key_name(self.plan)} is not in {path}; check its fingerprint "
                f"({key.get_name()} {key.fingerprint}), then add it (`ssh-keyscan -p {self.plan.ssh_port} "
                f"{self.plan.address} >> {path}`) or set ssh_strict_host_key_checking: accept-new for first contact")
        path.parent.mkdir(parents=True, exist_ok=True)
        client.get_host_keys().add(hostname, key.get_name(), key)
        with path.open("a") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


def connect(plan: HostPlan) -> Connection:
    kwargs = {"key_filename": plan.ssh_key} if plan.ssh_key else {}
    conn = Connection(plan.address, user=plan.ssh_user, port=plan.ssh_port, connect_kwargs=kwargs,
                      connect_timeout=15)
    path = known_hosts_file(plan)
    if path.exists():
        conn.client.load_host_keys(str(path))
    conn.client.set_missing_host_key_policy(_FirstContact(plan))
    return conn


def open_checked(conn: Connection, plan: HostPlan) -> None:
    """Open the connection; a changed host key becomes one line saying how to fix it."""
    try:
        conn.open()
    except paramiko.BadHostKeyException as error:
        path = known_hosts_file(plan)
        raise HostKeyError(
            f"{plan.name}: host key of {_key_name(plan)} CHANGED (offered {error.key.get_name()} "
            f"{error.key.fingerprint}, {path} has {error.expected_key.fingerprint}); if the host was rebuilt, "
            f"remove the old key with `ssh-keygen -R '{_key_name(plan)}' -f {path}`, else treat it as an "
            "attack") from None


def execute(conn: Connection, plan: HostPlan, command: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of one command."""
    open_checked(conn, plan)
    result = conn.run(command, hide=True, warn=True, in_stream=False)
    return result.exited, result.stdout, result.stderr
