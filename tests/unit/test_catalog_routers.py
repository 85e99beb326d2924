"""The routers catalog (modelfleet.plan.catalog.routers) held to the real routers' recorded help: every flag modelfleet
gives a router is one the router has, its policies are the router's own, and a recipe's flags name its PD part."""

import re

import pytest

from modelfleet.plan import router
from modelfleet.plan.catalog import load_catalog
from modelfleet.plan.catalog.routers import bootstrap_port, pd_role, specs
from modelfleet.plan.inventory import resolve
from tests.helpers.front_doors import KEY, fleet, recorded


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("MF_ROUTER_KEY", KEY)


def _options(help_text: str) -> set[str]:
    return set(re.findall(r"(?m)^\s+(--[a-z0-9-]+)", help_text))


@pytest.mark.parametrize("engine, help_file", [("vllm", "vllm-router-0.1.17-help.txt"),
                                               ("sglang", "smg-1.13.0-launch-help.txt")])
def test_every_flag_is_the_real_routers(engine, help_file):
    help_text = recorded(help_file)
    rp = resolve(fleet(engine)).routers["tiny-lab"]
    spec = router.spec(rp)
    flags = [a for a in router.router_args(rp) if a.startswith("--")]
    flags += [spec.worker_urls_flag, spec.api_key_flag]
    assert set(flags) <= _options(help_text), set(flags) - _options(help_text)
    choices = re.search(r"--policy \{([a-z_,]+)\}", help_text).group(1).split(",")
    assert spec.policies == choices and rp.policy in choices
    assert spec.version in help_file


def test_a_recipes_own_flags_name_its_part_of_a_pd_layout():
    recipes = load_catalog().recipes
    roles = {(r.engine, pd_role(r, r.engine)) for r in recipes.values()}
    assert {("sglang", "prefill"), ("sglang", "decode"), ("vllm", "prefill"), ("vllm", "decode")} <= roles
    for r in recipes.values():
        port = bootstrap_port(r, r.engine)
        if pd_role(r, r.engine) == "prefill" and r.engine == "sglang":
            assert port == 8998 or f"--disaggregation-bootstrap-port={port}" in r.args or str(port) in r.args
        elif specs().get(r.engine) is None or specs()[r.engine].pd is None or specs()[r.engine].pd.bootstrap is None:
            assert port is None
