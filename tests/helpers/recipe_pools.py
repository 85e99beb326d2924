"""Every catalog recipe as a pool of its own on each board it names (head and workers), for the tests that
render recipes (tests/unit/test_recipes.py, tests/unit/test_engine_parsers.py)."""

from __future__ import annotations

from modelfleet.plan import router
from modelfleet.plan.catalog import load_catalog
from modelfleet.plan.inventory import resolve

CATALOG = load_catalog()
PIN = "c" * 40
PARAMS = {"mamba_full_memory_ratio": 0.5}
RECIPE_BOARDS = [(r.id, hw) for r in CATALOG.recipes.values() for hw in r.hardware]


def pool(recipe_id: str, hardware: str, **extra):
    """The recipe's pool on `hardware`: as many hosts as its layout has nodes, each with `extra` inventory keys.
    One part of a prefill/decode layout gets a pool of the other part beside it (hosts m0...), as it must."""
    recipe = CATALOG.recipes[recipe_id]
    hosts = _hosts(recipe, hardware, "n", "p", 20, extra)
    role = router.pd_role(recipe, recipe.engine)
    if role:
        other = next(r for r in CATALOG.recipes.values() if (r.model, r.engine) == (recipe.model, recipe.engine)
                     and hardware in r.hardware and router.pd_role(r, r.engine) not in (None, role))
        hosts += _hosts(other, hardware, "m", "q", 40, extra)
    hosts = [(name, {k: v for k, v in data.items() if v is not None}) for name, data in hosts]
    return resolve(hosts)


def _hosts(recipe, hardware: str, prefix: str, pool_name: str, first: int, extra: dict) -> list:
    return [(f"{prefix}{i}", {"ssh_hostname": f"192.0.2.{first + i}", "hardware": hardware,
                              "gpu_count": CATALOG.hardware[hardware].gpus_per_node or None, "model": recipe.model,
                              "engine": recipe.engine, "recipe": recipe.id, "pool": pool_name, "revision": PIN,
                              "gpus": recipe.layout.gpus_per_node,
                              "recipe_params": {k: v for k, v in PARAMS.items() if k in recipe.parameters}, **extra})
            for i in range(recipe.layout.nodes)]
