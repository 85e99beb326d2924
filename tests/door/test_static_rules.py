"""Static rules before any connection (issue 50, item 5), through the door every command shares: each malformed
input is refused by `validate`, `plan` and `render` alike (exit 2, the file or host and the field named, no
traceback), and every error of the inventory is reported at once; the real `pyinfra` run's guard refuses the
same inventory before a single connection. Site files are read strictly (`.yml` too, a key written twice, a
folder named like a file); CLI arguments are parsed with messages that name the option."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from modelfleet.cli import main
from modelfleet.plan.catalog import CATALOG_DIR
from tests.helpers.listener import CountingListener

ROOT = Path(__file__).resolve().parents[2]
PIN = "0123456789abcdef0123456789abcdef01234567"
HOST = {"ssh_hostname": "192.0.2.10", "hardware": "h200", "gpu_count": 1, "model": "qwen3-8b", "engine": "vllm",
        "gpu_stack": False, "revision": PIN}
BOARD = yaml.safe_load((CATALOG_DIR / "hardware" / "h200.yaml").read_text())
RECIPE = yaml.safe_load((CATALOG_DIR / "recipes" / "qwen3-8b-vllm-1gpu.yaml").read_text())


@pytest.fixture(autouse=True)
def no_host_is_reached(monkeypatch):
    from modelfleet.fleet import status as fleet_status

    monkeypatch.setattr(fleet_status, "status", lambda plans: [])


def site(tmp_path: Path, data: dict, files: dict[str, str] | None = None) -> Path:
    inv = tmp_path / "site" / "inv.py"
    inv.parent.mkdir(parents=True, exist_ok=True)
    inv.write_text(f"gpus = {[('h1', data)]!r}\n")
    for rel, text in (files or {}).items():
        path = inv.parent / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            path.mkdir()
        else:
            path.write_bytes(text.encode("latin-1" if "latin" in rel else "utf-8"))
    return inv


def invoke(args: list[str]):
    return CliRunner().invoke(main, [str(a) for a in args])


def refused_everywhere(inv: Path, *words: str) -> str:
    """validate, plan and render refuse INV with exit 2, no traceback, every word in what they say."""
    said = []
    for args in (["validate", inv], ["plan", inv, "h1"], ["render", inv, "h1"]):
        result = invoke(args)
        assert result.exit_code == 2, (args[0], result.output)
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
        assert "Traceback" not in result.output
        for word in words:
            assert word in result.output, (args[0], word, result.output)
        said.append(result.output)
    return said[0]


def yaml_text(data: dict) -> str:
    return yaml.safe_dump(data, sort_keys=False)


# (case, host data changes, site files, words the refusal says)
CASES = [
    ("a .yml board is read, not skipped", {"hardware": "site-board"},
     {"hardware/board.yml": yaml_text({**BOARD, "id": "site-board", "gpus_per_node": 900})},
     ["board.yml", "gpus_per_node"]),
    ("a key written twice in a board", {},
     {"hardware/board.yaml": yaml_text({**BOARD, "id": "site-board"}) + "gpus_per_node: 4\n"},
     ["board.yaml:", "gpus_per_node", "written twice"]),
    ("a key written twice in a recipe, nested", {},
     {"recipes/r.yml": yaml_text({**RECIPE, "id": "site-r", "hardware": ["h200"]}).replace(
         "layout:\n", "layout:\n  tp: 1\n", 1)}, ["r.yml:", "tp", "written twice"]),
    ("a folder named like a board", {}, {"hardware/old.yaml": None}, ["old.yaml", "is a folder"]),
    ("a folder named like a recipe", {}, {"recipes/new.yml": None}, ["new.yml", "is a folder"]),
    ("a mirror with a branch", {"model_source": "https://mirror.site/models", "revision": "main"}, {},
     ["host h1", "revision", "mirror"]),
    ("a mirror with no revision", {"model_source": "file:///srv/mirror", "revision": None}, {},
     ["host h1", "revision", "main (unset)"]),
    ("a relative file:// source", {"model_source": "file://srv/mirror"}, {},
     ["host h1", "model_source", "absolute path"]),
    ("file:relative", {"model_source": "file:mirror"}, {}, ["host h1", "model_source"]),
    ("insecure_http_hosts with a path", {"insecure_http_hosts": ["hub.site/x"]}, {},
     ["host h1", "insecure_http_hosts"]),
    ("insecure_http_hosts with a port out of range", {"insecure_http_hosts": ["[fd00::1]:70000"]}, {},
     ["host h1", "insecure_http_hosts"]),
    ("insecure_http_hosts with an unclosed bracket", {"insecure_http_hosts": ["[fd00::1"]}, {},
     ["host h1", "insecure_http_hosts"]),
    ("a .YAML board is read too", {"hardware": "site-board"},
     {"hardware/board.YAML": yaml_text({**BOARD, "id": "site-board", "hbm_mib": -1})}, ["board.YAML", "hbm_mib"]),
]


CASES += [
    ("a site board not UTF-8", {}, {"hardware/latin.yaml": "id: caf\xe9\n"}, ["latin.yaml", "UTF-8"]),
    ("hardware/ is a file", {}, {"hardware": "id: x\n"}, ["hardware", "is not a folder"]),
    ("recipes/ is a file", {}, {"recipes": ""}, ["recipes", "is not a folder"]),
    ("a key written twice in a group_data file's dict", {}, {"group_data/all.py": "env = {'A': '1', 'A': '2'}\n"},
     ["all.py:1", "'A' is written twice"]),
]


@pytest.mark.parametrize("case,change,files,words", CASES, ids=[c[0] for c in CASES])
def test_refused_before_any_connection_by_every_command(tmp_path, case, change, files, words):
    data = {k: v for k, v in {**HOST, **change}.items() if v is not None}
    refused_everywhere(site(tmp_path, data, files), *words)


def test_a_key_written_twice_in_the_inventorys_own_dict_is_refused(tmp_path):
    inv = site(tmp_path, HOST)
    inv.write_text("gpus = [('h1', {'hardware': 'h200', 'model': 'qwen3-8b', 'engine': 'vllm',\n"
                   "                 'gpu_count': 1, 'port': 8000, 'port': 8001})]\n")
    refused_everywhere(inv, "inv.py:2", "'port' is written twice", "first on line 2")


def test_a_good_yml_board_and_recipe_are_read(tmp_path):
    files = {"hardware/board.yml": yaml_text({**BOARD, "id": "site-board"}),
             "recipes/r.yml": yaml_text({**RECIPE, "id": "site-r", "hardware": ["site-board"]})}
    inv = site(tmp_path, {**HOST, "hardware": "site-board", "recipe": "site-r"}, files)
    result = invoke(["validate", inv, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert [Path(p).name for p in out["site_hardware_files"]] == ["board.yml"]
    assert [Path(p).name for p in out["site_recipe_files"]] == ["r.yml"]


@pytest.mark.parametrize("entry,endpoint", [
    ("HUB.Site", "http://hub.site"), ("hub.site:8080", "http://HUB.SITE:8080"),
    ("[fd00::1]:8080", "http://[fd00::1]:8080"), ("FD00:0:0::1", "http://[fd00::1]:8080"),
    ("fd00::1", "http://[fd00:0::1]"),
])
def test_insecure_http_hosts_compare_as_urls_do(tmp_path, entry, endpoint):
    """Case-insensitive, and an IPv6 host in any notation (before: `HUB.Site` did not match the URL's host, and
    no IPv6 address could be written at all)."""
    inv = site(tmp_path, {**HOST, "hf_endpoint": endpoint, "insecure_http_hosts": [entry]})
    result = invoke(["validate", inv])
    assert result.exit_code == 0, result.output
    other = site(tmp_path, {**HOST, "hf_endpoint": endpoint, "insecure_http_hosts": ["other.site"]})
    assert invoke(["validate", other]).exit_code == 2


def test_every_error_at_once(tmp_path):
    inv = site(tmp_path, {**HOST, "model_source": "https://mirror.site/m", "revision": "main",
                          "rocm_version": "7.1", "router_port": 9000})
    result = invoke(["validate", inv, "--json"])
    errors = json.loads(result.stdout)["errors"]
    assert result.exit_code == 2 and {(e["where"], e["field"]) for e in errors} == {
        ("host h1", "revision"), ("host h1", "rocm_version"), ("host h1", "router_port")}, errors


@pytest.mark.parametrize("spec", ["²/3", "1/３", "١/2", " 1/2", "1/2\n", "+1/2"])
def test_shard_in_anything_but_ascii_digits_names_the_option(tmp_path, spec):
    inv = site(tmp_path, HOST)
    result = invoke(["converge", inv, "--shard", spec, "--dry"])
    assert result.exit_code == 2 and "--shard" in result.output and "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception


def test_more_slices_than_the_hosts_make_is_said(tmp_path):
    inv = site(tmp_path, HOST)
    result = invoke(["converge", inv, "--shard", "1/40", "--dry"])
    assert result.exit_code == 0 and "warning: --shard 1/40: the hosts chosen make only 1 slice" in result.output
    assert "--shard" not in invoke(["converge", inv, "--shard", "1/1", "--dry"]).output


@pytest.mark.slow
def test_the_guard_refuses_the_same_inputs_before_any_connection(tmp_path):
    """The real `pyinfra` command on an inventory with one input of each class: exit 2 before a connection,
    every error named at once."""
    listener = CountingListener()
    files = {"hardware/old.yaml": None}
    inv = site(tmp_path, {**HOST, "ssh_hostname": "127.0.0.1", "ssh_port": listener.port}, files)
    run = subprocess.run([sys.executable, "-m", "pyinfra", "-y", str(inv), "deploys/serve.py"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 2 and "old.yaml" in out and "is a folder" in out and "Traceback" not in out, out[-3000:]
    (inv.parent / "hardware" / "old.yaml").rmdir()
    gpus = [("h1", {**HOST, "ssh_hostname": "127.0.0.1", "ssh_port": listener.port,
                    "model_source": "https://mirror.site/m", "rocm_version": "7.1", "revision": "main"})]
    inv.write_text(f"gpus = {gpus!r}\n")
    run = subprocess.run([sys.executable, "-m", "pyinfra", "-y", str(inv), "deploys/serve.py"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    listener.sock.close()
    assert run.returncode == 2 and "nothing was touched" in out, out[-3000:]
    for words in ("revision: main is not a commit, but model_source is a mirror", "rocm_version",
                  "applies only to AMD hosts"):
        assert words in out, (words, out[-3000:])
    assert listener.count == 0


@pytest.mark.parametrize("levels", ["١,4", "²", "1,,4", "0"])
def test_bench_concurrency_in_anything_but_ascii_digits_names_the_option(levels):
    """Refused before any request (the base URL is a port nothing listens on)."""
    result = invoke(["bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--concurrency", levels])
    assert result.exit_code == 2 and "--concurrency" in result.output and "Traceback" not in result.output, \
        result.output


def test_a_value_the_schema_refuses_does_not_hide_the_hosts_other_errors(tmp_path):
    """A malformed `insecure_http_hosts` entry and a relative file:// source (schema) beside an AMD-only setting
    on an NVIDIA host and a mirror with a branch (cross-field): all four at once."""
    inv = site(tmp_path, {**HOST, "insecure_http_hosts": ["a b"], "model_source": "file://srv/m",
                          "rocm_version": "7.1", "revision": "main", "router_port": 9000})
    result = invoke(["validate", inv, "--json"])
    fields = {(e["where"], e["field"]) for e in json.loads(result.stdout)["errors"]}
    assert result.exit_code == 2 and fields == {("host h1", "insecure_http_hosts.0"), ("host h1", "model_source"),
                                                ("host h1", "rocm_version"), ("host h1", "router_port")}, fields
