"""`make test`'s two shards (tests/conftest.py): every lab module the list names exists (a misspelt one would
silently run beside the real vLLM's machine-wide checks), and the lab's modules fall on both sides."""

from tests.conftest import ROOT, SHARD_B_LAB, shard_of


def test_the_named_lab_modules_exist_and_each_test_module_has_one_shard():
    lab = ROOT / "tests" / "lab"
    assert {p.name for p in lab.glob("test_*.py")} >= SHARD_B_LAB
    shards = {p.name: shard_of(p) for p in lab.glob("test_*.py")}
    assert {name for name, shard in shards.items() if shard == "b"} == SHARD_B_LAB
    assert "a" in shards.values()
    assert shard_of(ROOT / "tests" / "unit" / "test_layers.py") == "b"
    assert shard_of(ROOT / "tests" / "router" / "test_rolling_upgrade_e2e.py") == "b"
