"""TokenSpeed's real `tokenspeed serve` parsers (lab/engine_parsers/tokenspeed_check.py: its command, argv
splitter, engine ServerArgs and smg gateway parsers, in an environment of their own) accept every TokenSpeed
recipe's command line as modelfleet renders it, on every board it names; refuse a broken one; the recipes'
engine_version is the version checked; and the engine double's TokenSpeed flag list is the parsers' own, so the
double that stands in for TokenSpeed in the lab (lab/engine_double) takes what the real command takes.
`make test` may not skip these (MODELFLEET_REQUIRE_ENGINE_PARSERS)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

import lab.engine_parsers as engine_parsers
from modelfleet import REPO_ROOT
from modelfleet.plan import render
from tests.helpers.recipe_pools import CATALOG, RECIPE_BOARDS, pool
from tests.unit.test_exposure import DOUBLE

pytestmark = pytest.mark.slow  # the real parsers, in their own interpreter

REQUIREMENTS, CHECK, PREFIX = engine_parsers.TOKENSPEED
DOUBLE_FLAGS = REPO_ROOT / "modelfleet" / "plan" / "catalog" / "engine_flags.json"
CHECKED = [(r, hw) for r, hw in RECIPE_BOARDS if CATALOG.recipes[r].engine == "tokenspeed"]

if not engine_parsers.built(REQUIREMENTS, PREFIX):
    reason = f"TokenSpeed's parser environment is not built ({engine_parsers.venv_dir(REQUIREMENTS, PREFIX)}): " \
             "make engine-parsers"
    if os.environ.get("MODELFLEET_REQUIRE_ENGINE_PARSERS"):
        raise RuntimeError(reason)
    pytestmark = [pytestmark, pytest.mark.skip(reason=reason)]


def run_check(*args: str, items=None) -> dict | None:
    proc = subprocess.run([str(engine_parsers.python(REQUIREMENTS, PREFIX)), str(CHECK), *args], text=True,
                          capture_output=True, timeout=300, input=json.dumps(items) if items is not None else None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout) if items is not None else None


def rendered() -> list[dict]:
    items = []
    for recipe_id, hardware in CHECKED:
        result = pool(recipe_id, hardware)
        assert result.errors == [], result.errors
        svc = result.hosts["n0"].services[0]
        items.append({"id": f"{recipe_id}@{hardware}", "engine": "tokenspeed", "argv": render.engine_argv(svc)})
    return items


@pytest.fixture(scope="module")
def checked():
    """One run of the real parsers over every rendered command line and over broken copies of the first (an
    unknown flag, an unknown tool-call parser, a parallel size without its value): proof the check can fail."""
    items = rendered()
    first = items[0]["argv"]
    at = first.index("--tool-call-parser") + 1
    broken = [{"id": "unknown-flag", "engine": "tokenspeed", "argv": first + ["--no-such-flag", "1"]},
              {"id": "unknown-parser", "engine": "tokenspeed",
               "argv": first[:at] + ["no_such_parser"] + first[at + 1:]},
              {"id": "size-without-value", "engine": "tokenspeed", "argv": first + ["--tensor-parallel-size"]}]
    out = run_check("argvs", items=items + broken)
    return {"versions": out["versions"], "results": {r["id"]: r for r in out["results"]},
            "ids": [item["id"] for item in items], "items": items}


def test_every_tokenspeed_recipe_and_board_is_checked():
    assert {hw for _, hw in CHECKED} >= {"b300", "mi355x", "mi350x"}


def test_every_rendered_command_line_is_accepted_by_tokenspeeds_own_parsers(checked):
    refused = {i: checked["results"][i]["error"] for i in checked["ids"] if not checked["results"][i]["ok"]}
    assert not refused, json.dumps(refused, indent=1)


def test_a_broken_command_line_is_refused_by_the_real_parsers(checked):
    results = checked["results"]
    assert "unrecognized arguments: --no-such-flag" in results["unknown-flag"]["error"]
    assert "invalid choice: 'no_such_parser'" in results["unknown-parser"]["error"]
    assert "--tensor-parallel-size requires a value" in results["size-without-value"]["error"]


def test_each_recipes_engine_version_is_the_version_checked(checked):
    wrong = {r: CATALOG.recipes[r].engine_version for r, _ in CHECKED
             if CATALOG.recipes[r].engine_version != checked["versions"]["tokenspeed"]}
    assert not wrong, (wrong, checked["versions"])


def test_the_double_flag_list_is_generated_from_the_real_parsers(tmp_path):
    regenerated = tmp_path / "flags.json"
    shutil.copy(DOUBLE_FLAGS, regenerated)
    run_check("flags", str(regenerated))
    assert json.loads(regenerated.read_text())["tokenspeed"] == json.loads(DOUBLE_FLAGS.read_text())["tokenspeed"], \
        "modelfleet/plan/catalog/engine_flags.json is stale: make engine-flags"


def test_the_double_takes_what_the_real_parsers_take_and_refuses_what_they_refuse(checked):
    """The lab's stand-in for TokenSpeed starts with every command line the real parsers accepted, and exits on
    the flag they refused, as `tokenspeed serve` would."""
    for item in checked["items"]:
        args = DOUBLE.parse_args("tokenspeed", item["argv"])
        assert args["--host"] == "127.0.0.1" and args["--served-model-name"] == "kimi-k3"
    with pytest.raises(SystemExit, match="unrecognized arguments: --no-such-flag"):
        DOUBLE.parse_args("tokenspeed", checked["items"][0]["argv"] + ["--no-such-flag", "1"])
