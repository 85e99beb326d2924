"""The catalog's types (modelfleet.plan.catalog.types): strict (an unknown key or a wrong type is refused, never
dropped), frozen, and each file's own rules checked as it is read."""

import pytest
from pydantic import ValidationError

from modelfleet.plan.catalog import load_catalog
from modelfleet.plan.catalog.types import Layout, ReadyBudget


def test_a_layout_is_strict_frozen_and_its_world_is_tp_pp_dp():
    layout = Layout(tp=4, pp=2, dp=2, nodes=2, gpus_per_node=8)
    assert layout.world_size == 16
    with pytest.raises(ValidationError, match="extra"):
        Layout(tp=4, pipeline=2)
    with pytest.raises(ValidationError):
        layout.tp = 8  # frozen: a recipe cannot change under its readers


def test_a_ready_budget_whose_restart_exceeds_cold_is_refused_naming_both():
    with pytest.raises(ValidationError, match=r"restart \(20\) may not exceed cold \(10\)"):
        ReadyBudget(cold=10, restart=20, why="measured")


def test_the_shipped_catalog_reads_into_these_types():
    cat = load_catalog()
    recipe = cat.recipes["tiny-lab-vllm"]
    assert type(recipe.layout) is Layout and recipe in cat.recipes_for(recipe.model, "vllm", recipe.hardware[0])
