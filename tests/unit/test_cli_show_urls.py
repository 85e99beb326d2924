"""`show` on an inventory that does not validate still prints the host's merged settings with their origins,
the errors under them (exit 2); `urls --os` refuses a release the GPU stack does not know, naming the known
ones (exit 2, no traceback)."""

import json

from click.testing import CliRunner

from modelfleet.cli import main
from modelfleet.fleet.urls import known_systems

HOST = {"hardware": "h200", "gpu_count": 1, "model": "qwen3-8b", "engine": "vllm"}


def invoke(*argv):
    return CliRunner().invoke(main, [str(a) for a in argv])


def test_show_prints_settings_and_origins_when_validation_fails(tmp_path):
    """The host in two groups that disagree (a port one, another the other): the settings as merged, each with
    where it came from, and the host's errors below them."""
    inv = tmp_path / "inv.py"
    inv.write_text(f"gpus = [('h1', {HOST!r})]\nbad = [('h2', {{**{HOST!r}, 'port': 22}})]\n")
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "gpus.py").write_text("model_root = '/srv/weights'\n")
    done = invoke("show", inv, "h1")
    assert done.exit_code == 0, done.output
    bad = invoke("show", inv, "h2")
    assert bad.exit_code == 2 and "Traceback" not in bad.output
    settings, _, errors = bad.output.partition("errors:")
    assert '"h200"' in settings and "hardware" in settings and "port" in settings
    assert "22" in errors and "reserved for SSH" in errors
    other = invoke("show", inv, "h1", "--data", "gpu_count=99")
    assert other.exit_code == 2 and "gpu_count" in other.output and "99" in other.output
    assert "model_root" in other.output and "group_data" in other.output  # the origin of a value


def test_show_json_keeps_rows_on_stdout_and_errors_on_stderr(tmp_path):
    inv = tmp_path / "inv.py"
    inv.write_text(f"bad = [('h2', {{**{HOST!r}, 'port': 22}})]\n")
    done = CliRunner(mix_stderr=False).invoke(main, ["show", "--json", str(inv), "h2"]) if "mix_stderr" in \
        CliRunner.__init__.__code__.co_varnames else CliRunner().invoke(main, ["show", "--json", str(inv), "h2"])
    assert done.exit_code == 2
    rows = json.loads(done.stdout)
    assert {"key": "port", "value": 22, "from": rows[[r["key"] for r in rows].index("port")]["from"]} in rows
    assert "reserved for SSH" in done.stderr


def test_urls_refuses_an_unknown_os_naming_the_known(tmp_path):
    inv = tmp_path / "inv.py"
    inv.write_text(f"gpus = [('h1', {HOST!r})]\n")
    done = invoke("urls", inv, "--os", "ubuntu24.04")
    assert done.exit_code == 2 and "Traceback" not in done.output
    assert "ubuntu24.04" in done.output and all(name in done.output for name in known_systems())
    assert "ubuntu-24.04" in known_systems()
    ok = invoke("urls", inv, "--os", "ubuntu-24.04", "--json")
    assert ok.exit_code == 0 and json.loads(ok.output)["urls"]


def test_show_prints_a_host_given_data_in_two_groups(tmp_path):
    """The case that needs `show` most: pyinfra would merge the two silently; modelfleet refuses, and shows the
    merged settings with their origins, and the refusal under them."""
    inv = tmp_path / "inv.py"
    inv.write_text("a = [('h1', {'hardware': 'h200', 'gpu_count': 1})]\n"
                   "b = [('h1', {'model': 'qwen3-8b', 'engine': 'vllm'})]\n")
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "b.py").write_text("port = 8002\n")
    done = invoke("show", inv, "h1")
    assert done.exit_code == 2 and "Traceback" not in done.output
    settings, _, errors = done.output.partition("errors:")
    assert '"h200"' in settings and '"qwen3-8b"' in settings and "8002" in settings and "group_data" in settings
    assert "host h1 has data in groups a and b" in errors
    assert invoke("validate", inv).exit_code == 2
