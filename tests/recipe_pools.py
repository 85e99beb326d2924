"""Every catalog recipe as a pool of its own on each board it names (head and workers), for the tests that
render recipes (tests/unit/test_recipes.py, tests/unit/test_engine_parsers.py)."""

from __future__ import annotations

from modelfleet.catalog import load_catalog
from modelfleet.inventory import resolve

CATALOG = load_catalog()
PIN = "c" * 40
PARAMS = {"mamba_full_memory_ratio": 0.5}
RECIPE_BOARDS = [(r.id, hw) for r in CATALOG.recipes.values() for hw in r.hardware]


def pool(recipe_id: str, hardware: str, **extra):
    """The recipe's pool on `hardware`: as many hosts as its layout has nodes, each with `extra` inventory keys."""
    recipe = CATALOG.recipes[recipe_id]
    hosts = [(f"n{i}", {"ssh_hostname": f"192.0.2.{20 + i}", "hardware": hardware,
                        "gpu_count": CATALOG.hardware[hardware].gpus_per_node or None, "model": recipe.model,
                        "engine": recipe.engine, "recipe": recipe.id, "pool": "p", "revision": PIN,
                        "gpus": recipe.layout.gpus_per_node,
                        "recipe_params": {k: v for k, v in PARAMS.items() if k in recipe.parameters}, **extra})
             for i in range(recipe.layout.nodes)]
    hosts = [(name, {k: v for k, v in data.items() if v is not None}) for name, data in hosts]
    return resolve(hosts)
