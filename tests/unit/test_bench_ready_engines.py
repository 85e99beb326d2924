"""lab/bench_ready.py's engines: each one's scenario fields are the scenario's own (a typo would only show after
minutes of a real run), and an engine it does not know is refused by name."""

import pytest

from lab import bench_ready, scenario
from modelfleet.plan.catalog import load_catalog


@pytest.mark.parametrize("engine", sorted(bench_ready.ENGINES))
def test_each_engines_fields_make_a_scenario_and_its_recipe_exists(engine):
    _, recipe, fields = bench_ready.ENGINES[engine]
    made = scenario.make(only=["a", "b"], **fields(["a", "b"]))
    assert recipe in load_catalog().recipes
    if engine == "vllm":
        assert (made.real_vllm, made.real_vllm_replicas) == ("a", ["b"])
        assert load_catalog().recipes[recipe].engine == "vllm"


def test_an_unknown_engine_is_refused_by_name(capsys):
    with pytest.raises(SystemExit) as stopped:
        bench_ready.main(["1", "--engine", "sglang"])
    assert "--engine sglang: not one of llama.cpp, vllm" in str(stopped.value)
