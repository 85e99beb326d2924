"""The real llama-server (the lab's image: Debian's build 11669) judges every llama.cpp recipe's rendered command
line (each board it names): it parses the whole line before loading a model, so "failed to load model" in a
container without one means the line was accepted, and an unknown flag is refused. The engine double's
llama.cpp flag list is what `make engine-flags` generates from the same server's `--help`.
The catalog's llama.cpp recipes name build b11434 (the upstream image's); the lab checks them with 11669."""

from __future__ import annotations

import json
import shutil

import pytest

import lab
from lab.engine_parsers import llama_server
from modelfleet import REPO_ROOT
from modelfleet.plan import render
from tests.helpers.recipe_pools import CATALOG, RECIPE_BOARDS, pool

pytestmark = pytest.mark.lab

LLAMA = [(r, hw) for r, hw in RECIPE_BOARDS if CATALOG.recipes[r].engine == "llama.cpp"]


@pytest.fixture(scope="module")
def image(lab_hosts):  # the lab's images are built by then
    return lab.llama_server_image()


@pytest.mark.parametrize("recipe_id,hardware", LLAMA, ids=[f"{r}@{h}" for r, h in LLAMA])
def test_every_llamacpp_recipe_is_accepted_by_the_real_llama_server(image, recipe_id, hardware):
    result = pool(recipe_id, hardware)
    assert result.errors == [], result.errors
    for plan in result.hosts.values():
        argv = render.engine_argv(plan.services[0])
        assert llama_server.check(image, argv) is None, (argv, llama_server.check(image, argv))


def test_an_unknown_flag_is_refused_by_the_real_llama_server(image):
    argv = render.engine_argv(pool(*LLAMA[0]).hosts["n0"].services[0]) + ["--no-such-flag"]
    assert "invalid argument: --no-such-flag" in llama_server.check(image, argv)


def test_the_doubles_llamacpp_flags_are_the_real_servers(image, tmp_path):
    flags = REPO_ROOT / "modelfleet" / "plan" / "catalog" / "engine_flags.json"
    regenerated = tmp_path / "flags.json"
    shutil.copy(flags, regenerated)
    llama_server.write_flags(image, str(regenerated))
    assert json.loads(regenerated.read_text()) == json.loads(flags.read_text()), \
        "modelfleet/plan/catalog/engine_flags.json is stale: make engine-flags"
