"""End to end on the lab: real sshd, systemd, dockerd, registry and the openai SDK against engine doubles."""

import re
import secrets
import subprocess

import pytest
from openai import AuthenticationError, OpenAI

from lab import scenario, ssh
from modelfleet.base.commands import run_pyinfra

pytestmark = pytest.mark.lab

KEY = "lab-" + secrets.token_hex(16)


def pyinfra(*extra, **fields):
    """serve.py with every service's key in the control node's LAB_API_KEY (and the scenario's other `fields`)."""
    with scenario.applied(api_key_env="LAB_API_KEY", **fields):
        return run_pyinfra("inventories/lab.py", "deploys/serve.py", extra=extra, env={"LAB_API_KEY": KEY},
                           timeout=600)


@pytest.fixture(scope="module")
def fleet(lab_hosts):
    first = pyinfra()
    second = pyinfra()
    return lab_hosts, first, second


def test_serve_converges_then_changes_nothing(fleet):
    _, first, second = fleet
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert second.returncode == 0, second.stdout[-3000:]
    total = re.search(r"Grand total\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)", second.stdout + second.stderr)
    assert total and total.group(2) == "-" and total.group(3) == "-" and total.group(4) == total.group(1)


def test_units_active_and_endpoints_answer_with_the_key(fleet):
    specs, _, _ = fleet
    ports = {"vllm": 8000, "sglang": 30000, "llama.cpp": 8080}
    for spec in specs:
        unit = f"modelfleet-tiny-{spec['name']}.service"
        assert ssh(spec, f"systemctl is-active {unit}").stdout.strip() == "active"
        base = f"http://{spec['address']}:{ports[spec['engine']]}/v1"
        reply = OpenAI(base_url=base, api_key=KEY).chat.completions.create(
            model="tiny-lab", messages=[{"role": "user", "content": "hello"}])
        assert reply.choices[0].finish_reason == "stop" and reply.choices[0].message.content
        if spec["engine"] == "llama.cpp":  # the real llama-server (its answer is the tiny GGUF's noise)
            assert reply.system_fingerprint.startswith("b11669")
        else:  # the engine double names what it plays
            assert spec["engine"] in reply.choices[0].message.content
        with pytest.raises(AuthenticationError):
            OpenAI(base_url=base, api_key="wrong").models.list()


def test_key_is_in_no_command_line_unit_output_or_readable_file(fleet):
    specs, first, second = fleet
    assert KEY not in first.stdout + first.stderr + second.stdout + second.stderr
    assert KEY not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    for spec in specs:
        holders = ssh(spec, f"grep -rl {KEY} /etc /root /tmp /var/tmp {spec['config_dir']} 2>/dev/null").stdout.split()
        assert holders, "the key should be on the host, in 0600 files"
        for path in holders:
            assert ssh(spec, f"stat -c %a:%U {path}").stdout.strip() == "600:root", path
        assert KEY not in ssh(spec, "cat /etc/systemd/system/modelfleet-*.service").stdout


def test_crash_looping_engine_hits_start_limits_and_fails_with_journal(fleet):
    specs, _, _ = fleet
    run = pyinfra("--limit", specs[0]["name"], extra_args=["--no-such-engine-flag"])
    assert run.returncode != 0
    assert "unrecognized arguments: --no-such-engine-flag" in run.stdout + run.stderr
    unit = f"modelfleet-tiny-{specs[0]['name']}.service"
    shown = ssh(specs[0], f"systemctl show -p ActiveState -p NRestarts {unit}").stdout
    assert "ActiveState=failed" in shown
    assert int(re.search(r"NRestarts=(\d+)", shown).group(1)) <= 3  # StartLimitBurst, no restart storm
