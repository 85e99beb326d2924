"""The door: one resolution for every consumer, by pyinfra's own rules (held equal to pyinfra's loader), with
the files it read, warnings, `--offline`, and errors naming the group_data file that gave the value."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from modelfleet.base.loader import read_inventory
from modelfleet.cli import main
from modelfleet.plan.inventory.door import open_inventory, parse_value

HOST = {"hardware": "h200", "model": "qwen3-8b", "engine": "vllm", "gpu_stack": False}


def layout(tmp: Path) -> tuple[Path, Path]:
    """An inventory two folders deep, group_data beside it, beside the working directory and in an extra folder
    (each setting a value the others also set, so precedence shows)."""
    work = tmp / "work"
    inv = work / "sites" / "dc1" / "prod.py"
    inv.parent.mkdir(parents=True)
    inv.write_text("gpus = [('g1', {'port': 8001}), 'g2']\nother = ['g2']\n")
    for folder, text in ((work / "group_data", "model_root = '/srv/cwd'\nserved_name = 'from-cwd'\n"),
                         (inv.parent / "group_data", "model_root = '/srv/inv'\n"),
                         (tmp / "extra", "served_name = 'from-extra'\n")):
        folder.mkdir(parents=True)
        (folder / "all.py").write_text(text)
    (inv.parent / "group_data" / "gpus.py").write_text("".join(f"{k} = {v!r}\n" for k, v in HOST.items()))
    (inv.parent / "group_data" / "other.py").write_text("port = 9001\n")
    return work, inv


PYINFRA_LOAD = """
import json, sys
from pyinfra.api import State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory
ctx_state.set(State())
inv, cwd, extra, data = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
inventory = make_inventory(inv, cwd=cwd, override_data=data, group_data_directories=[extra])
print(json.dumps({h.name: h.data.dict() for h in inventory}))
"""


@pytest.mark.slow
def test_loader_equals_pyinfras_own(tmp_path):
    work, inv = layout(tmp_path)
    data = {"port": 8123}
    pyinfra = subprocess.run([sys.executable, "-c", PYINFRA_LOAD, str(inv), str(work), str(tmp_path / "extra"),
                              json.dumps(data)], cwd=work, capture_output=True, text=True, timeout=60)
    assert pyinfra.returncode == 0, pyinfra.stderr
    ours = read_inventory(str(inv), cwd=str(work), group_data=(str(tmp_path / "extra"),), override_data=data)
    assert dict(ours.entries) == json.loads(pyinfra.stdout)
    assert dict(ours.entries)["g1"]["served_name"] == "from-extra"  # a later folder wins, as in pyinfra
    assert ours.sources["g1"]["port"] == "--data"


def test_data_values_parse_as_pyinfra_parses_them():
    values = ["true", "False", "8000", "1.5", '["a", 1]', '{"k": "v"}', "plain", "0x10", "", "null"]
    theirs = subprocess.run([sys.executable, "-c", "import json, sys\nfrom pyinfra_cli.util import parse_cli_arg\n"
                             "print(json.dumps([parse_cli_arg(v) for v in json.loads(sys.argv[1])]))",
                             json.dumps(values)], capture_output=True, text=True, timeout=60)
    assert theirs.returncode == 0, theirs.stderr
    assert [parse_value(v) for v in values] == json.loads(theirs.stdout)


def test_error_names_the_group_data_file(tmp_path, monkeypatch):
    work, inv = layout(tmp_path)
    (inv.parent / "group_data" / "gpus.py").write_text("".join(f"{k} = {v!r}\n" for k, v in
                                                            {**HOST, "model": "qwen3-9b"}.items()))
    monkeypatch.chdir(work)
    result = open_inventory(str(inv))
    assert ("host g1", "model", "unknown model 'qwen3-9b' (known: kimi-k2-thinking, kimi-k3, kimi-k3.1-pro, "
            "qwen3-8b, tiny-lab, tiny-llama) (from sites/dc1/group_data/gpus.py)") in result.errors
    assert result.group_data_files == ["group_data/all.py", "sites/dc1/group_data/all.py",
                                       "sites/dc1/group_data/gpus.py", "sites/dc1/group_data/other.py"]


def test_missing_says_where_it_looked(tmp_path, monkeypatch):
    inv = tmp_path / "a" / "b" / "inv.py"
    inv.parent.mkdir(parents=True)
    inv.write_text("gpus = ['g1']\n")
    monkeypatch.chdir(tmp_path)
    [(where, field, message), *_] = open_inventory(str(inv)).errors
    assert (where, field) == ("host g1", "hardware")
    assert "none in group_data, a/b/group_data" in message


def test_group_service_keys_are_defaults_of_services_entries(tmp_path, monkeypatch):
    inv = tmp_path / "inv.py"
    inv.write_text("gpus = [('g1', {'services': [{'pool': 'a', 'gpus': 1}, {'pool': 'b', 'gpus': 1, "
                   "'port': 8001, 'model': 'tiny-lab', 'recipe': 'tiny-lab-vllm'}]})]\n")
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "gpus.py").write_text("hardware = 'h200'\ngpu_count = 2\nmodel = 'qwen3-8b'\n"
                                                     "engine = 'vllm'\nserved_name = 'shared'\n")
    monkeypatch.chdir(tmp_path)
    result = open_inventory(str(inv))
    assert result.errors == []
    a, b = result.hosts["g1"].services
    assert (a.model.id, a.served_name, b.model.id, b.served_name) == ("qwen3-8b", "shared", "tiny-lab", "shared")


def test_offline_skips_secrets_only(tmp_path, monkeypatch):
    inv = tmp_path / "inv.py"
    inv.write_text(f"gpus = [('g1', {{**{HOST!r}, 'api_key_env': 'NOT_SET_HERE', 'gpu_cout': 1}})]\n")
    monkeypatch.delenv("NOT_SET_HERE", raising=False)
    monkeypatch.chdir(tmp_path)
    online = CliRunner().invoke(main, ["validate", "--json", str(inv)])
    offline = CliRunner().invoke(main, ["validate", "--json", "--offline", str(inv)])
    fields = lambda out: {e["field"] for e in json.loads(out)["errors"]}  # noqa: E731
    assert fields(online.output) == {"api_key_env", "gpu_cout"}
    assert fields(offline.output) == {"gpu_cout"}  # nothing else relaxed
    assert json.loads(offline.output)["skipped"][0]["field"] == "api_key_env"


def test_warnings_and_strict(tmp_path, monkeypatch):
    inv = tmp_path / "inv.py"
    inv.write_text(f"gpus = [('g1', {{**{HOST!r}, 'hardware': 'h100', 'revision': '0' * 40}})]\n")
    monkeypatch.chdir(tmp_path)
    plain = CliRunner().invoke(main, ["validate", str(inv)])
    assert plain.exit_code == 0, plain.output
    assert "warning: host g1: gpus: 7 of its 8 GPUs serve nothing" in plain.output
    assert "warning: host g1: revision: 0000000000000000000000000000000000000000 is a placeholder" in plain.output
    strict = CliRunner().invoke(main, ["validate", "--strict", "--json", str(inv)])
    assert strict.exit_code == 2
    assert {e["field"] for e in json.loads(strict.output)["errors"]} == {"gpus", "revision"}


def test_site_recipe_whose_args_contradict_its_layout_is_refused(tmp_path, monkeypatch):
    recipes = Path(__file__).resolve().parents[2] / "modelfleet/plan/catalog/recipes"
    shipped = (recipes / "qwen3-8b-vllm-1gpu.yaml").read_text()
    inv = tmp_path / "inv.py"
    inv.write_text(f"gpus = [('g1', {{**{HOST!r}, 'recipe': 'site-qwen-dp8', 'gpus': 8}})]\n")
    (tmp_path / "recipes").mkdir()
    dp8 = shipped.replace("id: qwen3-8b-vllm-1gpu", "id: site-qwen-dp8").replace("dp: 1", "dp: 8").replace(
        "gpus_per_node: 1", "gpus_per_node: 8")
    assert "dp: 8" in dp8
    (tmp_path / "recipes" / "dp8.yaml").write_text(dp8)
    monkeypatch.chdir(tmp_path)
    [(where, field, message)] = open_inventory(str(inv)).errors
    assert where == str((tmp_path / "recipes" / "dp8.yaml").resolve()) and field == "file"
    assert "layout says dp 8 but args set no --data-parallel-size: the engine would run dp 1" in message
    (tmp_path / "recipes" / "dp8.yaml").write_text(dp8.replace("args: [", 'args: [--data-parallel-size, "4", '))
    [(_, _, message)] = open_inventory(str(inv)).errors
    assert "args set --data-parallel-size 4 but layout says dp 8" in message
    (tmp_path / "recipes" / "dp8.yaml").write_text(dp8.replace("args: [", 'args: [--data-parallel-size, "8", '))
    assert open_inventory(str(inv)).errors == []


def test_warnings_for_images_recipes_and_multi_node_pools(tmp_path, monkeypatch):
    """Each warning from its own cause: an image of another engine version than the recipe's flags were checked
    with, an image naming no version, and a multi-node pool without `fabric_address`; a recipe's notes are
    information."""
    inv = tmp_path / "inv.py"
    inv.write_text(
        f"odd = [('g1', {{**{HOST!r}, 'gpus': 1, 'gpu_count': 1, 'image': 'vllm/vllm-openai:v0.30.1'}})]\n"
        f"untagged = [('g2', {{**{HOST!r}, 'gpus': 1, 'gpu_count': 1, 'image': 'vllm/vllm-openai:latest'}})]\n"
        "trays = [('t1', {'ssh_hostname': '192.0.2.21'}), ('t2', {'ssh_hostname': '192.0.2.22', "
        "'fabric_address': '10.0.0.2'})]\n")
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "trays.py").write_text(
        "hardware = 'gb300'\nmodel = 'kimi-k3.1-pro'\nengine = 'vllm'\npool = 'k'\ngpu_stack = False\n"
        "revision = '0123456789abcdef0123456789abcdef01234567'\n")
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(main, ["validate", "--offline", "--json", str(inv)])
    assert out.exit_code == 0, out.output
    got = {(w["where"], w["field"]): w["message"] for w in json.loads(out.output)["warnings"]}
    recipe = open_inventory(str(inv)).hosts["g1"].services[0].recipe
    assert got[("pool g1", "image")] == (f"vllm/vllm-openai:v0.30.1 is vllm 0.30.1, but recipe {recipe.id}'s flags "
                                         f"were checked with {recipe.engine_version}")
    assert got[("pool g2", "image")].startswith("vllm/vllm-openai:latest names no engine version")
    assert got[("pool k", "fabric_address")].startswith("multi-node pool on the SSH address of t1:")
    info = {(i["where"], i["field"]): i["message"] for i in json.loads(out.output)["info"]}
    assert "modelfleet's, not the guide's" in info[("pool k", "recipe")]  # a recipe's notes: information (issue 42)
    assert CliRunner().invoke(main, ["validate", "--offline", "--strict", str(inv)]).exit_code == 2
