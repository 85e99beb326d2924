"""pyinfra's sudo password on a real lab host (sshd, sudo): a run as an ordinary SSH user with `_sudo` and
`_sudo_password` puts the password on no remote command line. sshd starts the user's shell as `SHELL -c COMMAND`,
so the shell's argv (what /proc/PID/cmdline shows any local user) is the command line pyinfra sends: the user's
shell here records its own argv before it runs the command. The commands still ran as root, stdin and uploads
included, and modelfleet's preflight took the run lock as root (its holder runs on an SSH channel of its own)."""

import secrets
import textwrap

import pytest

import lab
from modelfleet.base.commands import run_pyinfra

pytestmark = pytest.mark.lab
USER = "mfsudo"
ARGV_LOG = "/var/tmp/mfsudo-argv.log"


def root(spec, command: str) -> str:
    done = lab.ssh(spec, command)
    assert done.returncode == 0, (command, done.stdout, done.stderr)
    return done.stdout


def test_the_sudo_password_reaches_no_remote_command_line(lab_hosts, tmp_path):
    spec = lab_hosts[0]
    password = f"MFSUDO{secrets.token_hex(8)}"
    shell = "/usr/local/bin/mfsudo-shell"
    root(spec, textwrap.dedent(f"""\
        set -e
        id {USER} >/dev/null 2>&1 || useradd -m {USER}
        printf '#!/bin/sh\\nprintf "%%s\\\\n" "$*" >> {ARGV_LOG}\\nexec /bin/sh "$@"\\n' > {shell}
        chmod 755 {shell} && usermod -s {shell} {USER}
        echo '{USER}:{password}' | chpasswd
        echo '{USER} ALL=(ALL) ALL' > /etc/sudoers.d/{USER} && chmod 0440 /etc/sudoers.d/{USER}
        install -d -o {USER} -m 0700 /home/{USER}/.ssh
        install -o {USER} -m 0600 /root/.ssh/authorized_keys /home/{USER}/.ssh/authorized_keys
        install -o {USER} -m 0600 /dev/null {ARGV_LOG}
        rm -f /root/mfsudo-ran /root/mfsudo-stdin /root/mfsudo-put"""))
    (tmp_path / "up.txt").write_text("uploaded as root\n")
    deploy = tmp_path / "as_root.py"
    deploy.write_text(textwrap.dedent(f"""\
        from pyinfra.operations import files, server

        server.shell(name="as root", commands=["id -u > /root/mfsudo-ran"])
        server.shell(name="stdin kept", commands=["cat > /root/mfsudo-stdin"], _stdin="the command's own input")
        files.put(name="upload", src={str(tmp_path / "up.txt")!r}, dest="/root/mfsudo-put")
        """))
    as_user = {"ssh_user": USER, "_sudo": "true", "_sudo_password": password}
    try:
        root(spec, "rm -rf /run/modelfleet")
        with lab.scenario.applied(only=[spec["name"]]):
            run = run_pyinfra("inventories/lab.py", str(deploy), timeout=300, data=as_user)
            out = run.stdout + run.stderr
            assert run.returncode == 0, out[-3000:]
            command_lines = root(spec, f"cat {ARGV_LOG}")
            assert "sudo" in command_lines and "-c" in command_lines  # the shell recorded pyinfra's commands
            assert password not in command_lines, [line for line in command_lines.splitlines() if password in line]
            assert root(spec, "cat /root/mfsudo-ran").strip() == "0"  # the password worked: root ran them
            assert root(spec, "cat /root/mfsudo-stdin") == "the command's own input\n"
            assert root(spec, "cat /root/mfsudo-put") == "uploaded as root\n"
            # modelfleet's own stage: its facts through sudo, and the run lock's holder on its own SSH channel.
            preflight = run_pyinfra("inventories/lab.py", "deploys/preflight.py", timeout=300, data=as_user)
        out += preflight.stdout + preflight.stderr
        assert preflight.returncode == 0 and "Run lock" not in out, out[-3000:]
        assert root(spec, "stat -c '%U %a' /run/modelfleet /run/modelfleet/run.lock").split() == [
            "root", "700", "root", "600"]  # the holder ran as root
        assert password not in out and password not in root(spec, f"cat {ARGV_LOG}")
    finally:
        root(spec, f"rm -f /etc/sudoers.d/{USER} {ARGV_LOG} /root/mfsudo-*; userdel -r {USER} 2>/dev/null; true")
