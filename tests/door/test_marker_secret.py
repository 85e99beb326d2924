"""A marker secret through every door it can come in by (the API key an inventory names, the hub token, pyinfra's
sudo and SSH passwords, credentials in a mirror URL, a key holding a newline, a secret put in `env`) is found
nowhere an attacker without root could read it: not in any command's output (validate, show, render, urls, plan,
prometheus, each in text and JSON), not in the real `pyinfra` run's output (-vvv --debug, and its
debug-inventory dump), not in the reports directory, and on the host only in the files the run writes 0600."""

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests.door.test_one_truth import GROUP, PROBE_PARTS

pytestmark = pytest.mark.slow  # the CLI and pyinfra's own CLI in child processes

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
HELPERS = HERE.parent / "helpers"
MARK = f"MFSECRET{secrets.token_hex(6)}"  # every secret below starts with it: one search finds any of them
SECRETS = {"MF_TEST_API_KEY": f"{MARK}apikey0123456789", "MF_TEST_HF_TOKEN": f"hf_{MARK}hubtoken"}
HOST = "@fake/b300-01"


def inventory(tmp: Path, probe: list[str], **extra) -> Path:
    data = {"fake_responses": {"@@modelfleet-probe": probe}, "fake_delay": 0, "fake_delay_jitter": 0,
            **GROUP, "api_key_env": "MF_TEST_API_KEY", "hf_token_env": "MF_TEST_HF_TOKEN",
            "_sudo_password": f"{MARK}sudo", "_su_password": f"{MARK}su", "ssh_password": f"{MARK}ssh",
            "ssh_key_password": f"{MARK}sshkey",
            "model_source": f"https://mirror-user:{MARK}url@mirror.invalid/models", **extra}
    path = tmp / "inv.py"
    path.write_text(f"gpus = [({HOST!r}, {data!r})]\n")
    return path


def run(args: list[str], tmp: Path, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """In `tmp`, or for pyinfra in the checkout (its config.py is how a site's pyinfra runs load modelfleet's
    guard; an inventory ending in `refuse_invalid(__file__)` does the same)."""
    return subprocess.run(args, cwd=cwd or tmp, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **SECRETS, "MODELFLEET_REPORTS": str(tmp / "reports"),
                               "MODELFLEET_TEST_UPLOADS": str(tmp / "uploads.json"), "PYTHONPATH": str(ROOT),
                               **(env or {})})


def leaks(text: str) -> list[str]:
    return [text[max(0, m.start() - 60):m.end() + 20] for m in re.finditer(MARK, text)]


def modelfleet(*args: str, tmp: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "modelfleet.cli", *args], tmp, env)


def test_marker_in_no_output_report_or_readable_file(fake, tmp_path):
    inv = inventory(tmp_path, fake.probe_reply(PROBE_PARTS))
    outputs = {}
    for command in (["validate"], ["show", "x", HOST], ["render", "x", HOST], ["urls"], ["plan", "x", HOST],
                    ["prometheus"]):
        for form in ([], ["--json"]) if command[0] not in ("plan", "prometheus") else ([],):
            args = [a if a != "x" else str(inv) for a in command] + ([str(inv)] if "x" not in command else [])
            done = modelfleet(*args, *form, tmp=tmp_path)
            outputs[" ".join(command[:1] + form)] = done
    for name, done in outputs.items():
        assert done.returncode in (0, 1), (name, done.stdout[-2000:], done.stderr[-2000:])
        assert not leaks(done.stdout + done.stderr), (name, leaks(done.stdout + done.stderr))
    # What each printer shows in the secret's place (so the assertion above is about masking, not absence).
    rows = {r["key"]: r["value"] for r in json.loads(outputs["show --json"].stdout)}
    assert rows["_sudo_password"] == rows["ssh_password"] == rows["_su_password"] == "********"
    assert rows["model_source"] == "https://********@mirror.invalid/models"
    assert "https://********@mirror.invalid/models" in outputs["urls"].stdout
    shown = {f["path"]: f["content"] for f in json.loads(outputs["render --json"].stdout)["files"]}
    assert "VLLM_API_KEY=********" in shown["/etc/modelfleet/k31.env"]

    pyinfra = [sys.executable, str(HELPERS / "pyinfra_fake_cli.py"), "-y", "-vvv", "--debug", str(inv),
               str(HELPERS / "serve_fake.py")]
    served = run(pyinfra, tmp_path, cwd=ROOT)
    assert served.returncode == 0, (served.stdout + served.stderr)[-4000:]
    uploads = json.loads((tmp_path / "uploads.json").read_text())
    debug = run([sys.executable, str(HELPERS / "pyinfra_fake_cli.py"), "-y", str(inv), "debug-inventory"], tmp_path,
                cwd=ROOT)
    assert "_sudo_password" in debug.stdout + debug.stderr  # pyinfra dumped the host data, masked
    for name, done in (("pyinfra run", served), ("pyinfra debug-inventory", debug)):
        assert not leaks(done.stdout + done.stderr), (name, leaks(done.stdout + done.stderr))
    reports = [p for p in (tmp_path / "reports").rglob("*") if p.is_file()]
    assert reports, "the run wrote no report to look in"
    for path in reports:
        assert not leaks(path.read_text(errors="replace")), path
    # On the host, the key is only in files the run writes 0600 (the env file the engine reads, the header the
    # checks send): each named so by its operation.
    holding = {path for path, content in uploads.items() if MARK in content}
    private = set(re.findall(r"(/\S+) \(0600\)", served.stdout + served.stderr))
    assert "/etc/modelfleet/k31.env" in holding and holding <= private, (holding, private)
    assert SECRETS["MF_TEST_API_KEY"] in uploads["/etc/modelfleet/k31.env"]  # the run itself got the real key


def test_key_with_a_newline_is_not_printed_by_the_run(fake, tmp_path):
    """A key holding a newline stops the run (it would add a line to the env file): the exception that says so
    prints neither line of it."""
    inv = inventory(tmp_path, fake.probe_reply(PROBE_PARTS))
    key = f"{MARK}first-line\n{MARK}second-line"
    served = run([sys.executable, str(HELPERS / "pyinfra_fake_cli.py"), "-y", "-vv", str(inv),
                  str(HELPERS / "serve_fake.py")], tmp_path, env={"MF_TEST_API_KEY": key}, cwd=ROOT)
    out = served.stdout + served.stderr
    assert served.returncode != 0 and "control character" in out, out[-3000:]
    assert not leaks(out), leaks(out)
    rendered = modelfleet("render", str(inv), HOST, tmp=tmp_path, env={"MF_TEST_API_KEY": key})
    assert not leaks(rendered.stdout + rendered.stderr)


@pytest.mark.parametrize("name", ["OPENAI_API_KEY", "MY_TOKEN", "DB_PASSWORD", "app_secret"])
def test_secret_in_env_refused_without_echo(fake, tmp_path, name):
    inv = inventory(tmp_path, fake.probe_reply(PROBE_PARTS), env={name: f"{MARK}inenv"})
    for form in ([], ["--json"]):
        done = modelfleet("validate", str(inv), *form, tmp=tmp_path)
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"env.{name}" in done.stdout + done.stderr and "api_key_env" in done.stdout + done.stderr
        assert not leaks(done.stdout + done.stderr)
    shown = modelfleet("show", str(inv), HOST, tmp=tmp_path)
    assert shown.returncode == 2 and not leaks(shown.stdout + shown.stderr)


def test_pyinfra_debug_log_is_masked_and_private(tmp_path):
    """An internal error in a run makes pyinfra write the full traceback to ./pyinfra-debug.log: a reader of that
    file (0644 by default, and one left by an earlier run) gets the key masked, and no one else can read it."""
    (tmp_path / "inv.py").write_text(
        "hosts = [('@fake/h1', {'hardware': 'lab-cpu', 'model': 'tiny-lab', 'engine': 'vllm', "
        "'recipe': 'tiny-lab-vllm', 'api_key_env': 'MF_TEST_API_KEY', 'fake_delay': 0, 'fake_delay_jitter': 0})]\n"
        "from modelfleet.plan.inventory import refuse_invalid; refuse_invalid(__file__)\n")
    (tmp_path / "boom.py").write_text(
        "import os\nfrom pyinfra.operations import server\n\n\ndef boom():\n"
        "    raise RuntimeError('the key is ' + os.environ['MF_TEST_API_KEY'])\n\n\n"
        "server.shell(name='x', commands=['true'], _if=boom)\n")
    log = tmp_path / "pyinfra-debug.log"
    log.write_text("an earlier run's\n")
    log.chmod(0o644)
    done = run([sys.executable, str(HELPERS / "pyinfra_fake_cli.py"), "-y", "inv.py", "boom.py"], tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "written to pyinfra-debug.log" in out, out[-3000:]
    written = log.read_text()
    assert "RuntimeError: the key is ********" in written, written
    assert not leaks(written) and not leaks(out), (leaks(written), leaks(out))
    assert log.stat().st_mode & 0o777 == 0o600
