"""Inventory files and group_data read as pyinfra reads them (tests/door/test_inventory_door.py holds the result
equal to pyinfra_cli's own loader): which variables are groups, what group_data gives, where each value came
from, and a file that does not run as one error naming its file and line."""

import pytest

from modelfleet.base import loader
from modelfleet.base.loader import InventoryFileError, read_inventory


def write(path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_lists_and_host_data_tuples_are_groups_and_the_rest_is_not(tmp_path):
    inv = write(tmp_path / "site.py", "import os\n_spare = ['x1']\nport = 8000\nnames = {'a': 1}\n"
                                      "gpus = (['g1', ('g2', {'port': 8002})], {'port': 8001, 'pool': 'p'})\n"
                                      "edge = ['g2', 'e1']\n")
    loaded = read_inventory(str(inv), cwd=str(tmp_path))
    assert [name for name, _ in loaded.entries] == ["g1", "g2", "e1"]
    data = dict(loaded.entries)
    assert (data["g1"]["port"], data["g2"]["port"], data["g2"]["pool"]) == (8001, 8002, "p")  # host over group
    assert "port" not in data["e1"] and "x1" not in data
    assert loaded.groups["site"] == ["g1", "g2", "e1"]  # the file's own name is a group of every host
    assert (loaded.groups["gpus"], loaded.groups["edge"]) == (["g1", "g2"], ["g2", "e1"])
    assert loaded.sources["g2"]["port"] == loaded.sources["g1"]["port"] == str(inv)


def test_group_data_gives_each_group_its_values_and_says_which_file_gave_each(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    inv = write(tmp_path / "site.py", "gpus = ['g1']\nedge = ['e1']\n")
    write(tmp_path / "group_data" / "all.py", "import json\nfrom os import path as p\nmodel_root = '/srv'\n"
                                              "engine = 'vllm'\n")
    write(tmp_path / "group_data" / "gpus.py", "__all__ = ['engine']\nengine = 'sglang'\nhelper = 1\n")
    write(tmp_path / "extra" / "gpus.py", "engine = 'llama.cpp'\n")
    loaded = read_inventory(str(inv), group_data=(str(tmp_path / "extra"),), override_data={"model_root": "/d"})
    data = dict(loaded.entries)
    assert data["g1"] == {"model_root": "/d", "engine": "llama.cpp"}  # no imports, only __all__, later folder wins
    assert data["e1"] == {"model_root": "/d", "engine": "vllm"}
    assert loaded.sources["g1"] == {"model_root": "--data", "engine": "extra/gpus.py"}
    assert loaded.sources["e1"]["engine"] == "group_data/all.py"
    assert loaded.files == ["group_data/all.py", "group_data/gpus.py", "extra/gpus.py"]
    assert loaded.folders == ["group_data", "extra"]


def test_group_data_beside_an_inventory_elsewhere_is_read_after_the_working_directorys(tmp_path):
    inv = write(tmp_path / "sites" / "dc1.py", "gpus = ['g1']\n")
    write(tmp_path / "group_data" / "all.py", "engine = 'vllm'\nmodel_root = '/cwd'\n")
    write(tmp_path / "sites" / "group_data" / "all.py", "model_root = '/beside'\n")
    assert loader.group_data_folders(str(inv), str(tmp_path)) == [tmp_path / "group_data",
                                                                  tmp_path / "sites" / "group_data"]
    loaded = read_inventory(str(inv), cwd=str(tmp_path))
    assert dict(loaded.entries)["g1"] == {"engine": "vllm", "model_root": "/beside"}


def test_an_inventory_without_hosts_loads_empty(tmp_path):
    inv = write(tmp_path / "empty.py", "note = 'nothing yet'\n")
    assert read_inventory(str(inv), cwd=str(tmp_path)).entries == []


@pytest.mark.parametrize("text, line, message", [
    ("gpus = ['g1'\n", 1, "syntax error: "),
    ("gpus = ['g1']\n\nport = 1 / 0\n", 3, "ZeroDivisionError: division by zero"),
    ("import missing_module_of_the_site\n", 1, "ModuleNotFoundError: No module named 'missing_module_of_the_site'"),
])
def test_a_file_that_does_not_run_is_one_error_naming_its_line(tmp_path, text, line, message):
    inv = write(tmp_path / "site.py", text)
    with pytest.raises(InventoryFileError) as caught:
        read_inventory(str(inv), cwd=str(tmp_path))
    assert caught.value.where == f"{inv}:{line}" and caught.value.message.startswith(message)
    assert str(caught.value).startswith(f"{inv}:{line}: ")


def test_a_group_data_file_that_does_not_run_names_that_file(tmp_path):
    inv = write(tmp_path / "site.py", "gpus = ['g1']\n")
    broken = write(tmp_path / "extra" / "gpus.py", "engine = 'vllm'\nraise ValueError('no engine today')\n")
    with pytest.raises(InventoryFileError, match=f"^{broken}:2: ValueError: no engine today$"):
        read_inventory(str(inv), cwd=str(tmp_path), group_data=(str(tmp_path / "extra"),))


@pytest.mark.parametrize("text, message", [
    ("gpus = ['g1', 7]\n", "group gpus: host 7 is neither a name nor (name, dict)"),
    ("gpus = [('g1', 8000)]\n", "group gpus: host g1: its data must be a dict, got int"),
    ("gpus = [('g1',)]\n", "group gpus: host g1: its data must be a dict, got nothing"),
    ("gpus = ['g1', 'g2', 'g1']\n", "group gpus: host g1 is listed twice"),
])
def test_hosts_pyinfra_would_take_silently_or_crash_on_are_refused(tmp_path, text, message):
    inv = write(tmp_path / "site.py", text)
    with pytest.raises(InventoryFileError) as caught:
        read_inventory(str(inv), cwd=str(tmp_path))
    assert (caught.value.where, caught.value.message) == (str(inv), message)


def test_data_in_two_groups_is_a_problem_but_still_loads_as_pyinfra_merges_it(tmp_path):
    """Refused (validate lists it), yet the host's merged data is there for `show` to print with its origins."""
    inv = write(tmp_path / "site.py", "gpus = [('g1', {'port': 1, 'model': 'm'})]\nedge = [('g1', {'port': 2})]\n")
    loaded = read_inventory(str(inv), cwd=str(tmp_path))
    assert loaded.problems == [(str(inv), "file", "host g1 has data in groups gpus and edge: give it in one place")]
    assert dict(loaded.entries)["g1"]["model"] == "m" and "port" in dict(loaded.entries)["g1"]


def test_a_missing_inventory_file_is_named(tmp_path):
    with pytest.raises(InventoryFileError, match="nope.py: no such inventory file"):
        read_inventory(str(tmp_path / "nope.py"), cwd=str(tmp_path))


def test_a_file_knows_it_is_being_read_as_an_inventory(tmp_path):
    inv = write(tmp_path / "site.py", "from modelfleet.base.loader import LOADING\n"
                                      "gpus = [('g1', {'loading': LOADING.get()})]\n")
    assert dict(read_inventory(str(inv), cwd=str(tmp_path)).entries)["g1"]["loading"] is True
    assert loader.LOADING.get() is False
