"""pyinfra and modelfleet as child processes of this interpreter: the argv they get, and real runs of both."""

import json
import sys
from pathlib import Path

import pytest

from modelfleet.base import commands
from modelfleet.run import deploys

ROOT = Path(__file__).resolve().parents[2]


def test_every_deploy_names_a_stage_entry_point_of_the_package_and_of_the_checkout():
    for name in deploys.DEPLOYS:
        module, _, function = deploys.deploy(name).rpartition(".")
        assert module == deploys.__name__ and function == name and callable(getattr(deploys, name))
    assert sorted(deploys.DEPLOYS) == sorted(p.stem for p in (ROOT / "deploys").glob("*.py"))
    assert {"serve", "prefetch", "retire"} <= set(deploys.DEPLOYS) and "run_stages" not in deploys.DEPLOYS


def test_an_unknown_deploy_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="no deploy 'serv' .*serve, gpu_stack, prefetch"):
        deploys.deploy("serv")


def test_inventory_arguments_keep_group_data_before_data_and_their_order():
    assert commands.inventory_args(["a", "b"], ["k=1", "j=2"]) == [
        "--group-data", "a", "--group-data", "b", "--data", "k=1", "--data", "j=2"]
    assert commands.inventory_args() == []


def test_pyinfra_runs_from_this_interpreter():
    argv = commands.pyinfra_argv("inv.py", "modelfleet.run.deploys.serve", limit=["h1", "h2"], data={"k": 1},
                                 group_data=["gd"], extra=["--debug"], yes=False)
    assert argv == [sys.executable, "-m", "pyinfra", "--limit", "h1", "--limit", "h2", "--group-data", "gd",
                    "--data", "k=1", "--debug", "inv.py", "modelfleet.run.deploys.serve"]
    assert commands.pyinfra_argv("inv.py", "d")[:4] == [sys.executable, "-m", "pyinfra", "-y"]
    assert commands.modelfleet_argv("plan", "x") == [sys.executable, "-m", "modelfleet.cli", "plan", "x"]


@pytest.mark.slow
def test_a_pyinfra_run_sees_its_limit_data_group_data_and_environment(tmp_path):
    """A real pyinfra run on the local host: what its deploy sees is what the arguments said."""
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "all.py").write_text("from_group = 'group'\n")
    (tmp_path / "inventory.py").write_text("hosts = ['@local']\n")
    (tmp_path / "deploy.py").write_text(
        "import json, os\nfrom pyinfra import host\n"
        "open('seen.json', 'w').write(json.dumps({'host': host.name, 'k': host.data.get('k'), "
        "'group': host.data.get('from_group'), 'env': os.environ.get('MODELFLEET_TEST_MARK')}))\n")
    run = commands.run_pyinfra("inventory.py", "deploy.py", limit=["@local"], data={"k": "v"},
                               group_data=[str(tmp_path / "group_data")], env={"MODELFLEET_TEST_MARK": "m"},
                               cwd=str(tmp_path), timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads((tmp_path / "seen.json").read_text()) == {"host": "@local", "k": "v", "group": "group",
                                                                 "env": "m"}


@pytest.mark.slow
def test_a_modelfleet_run_is_the_cli_of_this_package(tmp_path):
    run = commands.run_modelfleet("--help", cwd=str(tmp_path), timeout=120)
    assert run.returncode == 0 and "Usage:" in run.stdout
    refused = commands.run_modelfleet("no-such-command", cwd=str(tmp_path), timeout=120)
    assert refused.returncode != 0 and "no-such-command" in refused.stderr
