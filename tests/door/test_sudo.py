"""sudo's password in a real `pyinfra` run (@local, a stand-in sudo that records how it was called): it reaches
sudo on stdin (`-S`), never as an argument or through pyinfra's askpass; where sudo asks no password (NOPASSWD),
nothing is sent, so the command's own stdin is exactly its own. The lab test (tests/lab/test_sudo_stdin_e2e.py)
does the same with the real sudo and sshd."""

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # pyinfra's CLI in a child process
ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
HELPERS = HERE.parent / "helpers"
SUDO = """#!/bin/sh
printf 'argv: %s\\n' "$*" >> "$SUDO_LOG"
env | grep -q '^PYINFRA_SUDO_PASSWORD=' && echo 'askpass variable' >> "$SUDO_LOG"
case " $* " in *" -n -k "*) [ -n "$NOPASSWD" ]; exit;; esac  # the probe: does sudo ask a password?
for a; do [ "$a" = -S ] && { IFS= read -r pw; printf 'stdin: %s\\n' "$pw" >> "$SUDO_LOG"; }; done
while [ "$1" != sh ]; do shift; done
exec "$@"
"""


def run(tmp_path: Path, password: str, **env) -> tuple[str, str]:
    (tmp_path / "bin").mkdir(exist_ok=True)
    (tmp_path / "bin" / "sudo").write_text(SUDO)
    (tmp_path / "bin" / "sudo").chmod(0o755)
    (tmp_path / "inv.py").write_text(
        f"hosts = [('@local', {{'hardware': 'lab-cpu', 'model': 'tiny-lab', 'engine': 'vllm', "
        f"'recipe': 'tiny-lab-vllm', '_sudo': True, '_sudo_password': {password!r}}})]\n"
        "from modelfleet.plan.inventory import refuse_invalid; refuse_invalid(__file__)\n")
    (tmp_path / "deploy.py").write_text(
        "from pyinfra.operations import server\n\n"
        f"server.shell(name='own stdin', commands=['cat > {tmp_path}/stdin'], _stdin='own input')\n")
    log = tmp_path / "sudo.log"
    log.unlink(missing_ok=True)
    done = subprocess.run([sys.executable, str(HELPERS / "pyinfra_fake_cli.py"), "-y", "-vv", "inv.py", "deploy.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
                               "PYTHONPATH": str(ROOT), "SUDO_LOG": str(log),
                               "MODELFLEET_TEST_UPLOADS": str(tmp_path / "uploads.json"), **env})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return log.read_text(), (tmp_path / "stdin").read_text()


def test_the_password_reaches_sudo_on_stdin_only(tmp_path):
    password = f"pw-{secrets.token_hex(8)}"
    log, stdin = run(tmp_path, password)
    assert f"stdin: {password}" in log.splitlines()  # sudo -S read it
    assert "argv: -H -S -k --prompt= sh -c cat > " in log
    assert password not in "".join(line for line in log.splitlines() if line.startswith("argv"))
    assert "askpass variable" not in log
    assert stdin == "own input\n"  # the command's stdin is its own, the password line went to sudo


def test_no_password_is_sent_where_sudo_asks_none(tmp_path):
    password = f"pw-{secrets.token_hex(8)}"
    log, stdin = run(tmp_path, password, NOPASSWD="1")
    assert "stdin:" not in log and password not in log
    assert "argv: -H -n sh -c cat > " in log
    assert stdin == "own input\n"  # with NOPASSWD, a password line would have reached the command
