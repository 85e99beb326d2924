"""Every recipe, rendered on every board it names (each host of a multi-node pool, head and workers): the memory
fraction the planner sized with is on the command line, no flag appears twice, the checked engine version is
recorded, required parameters are asked for, and GGUF recipes fetch only their quantization."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from modelfleet.base import grammar, runscope
from modelfleet.cli import main
from modelfleet.plan import render
from modelfleet.plan.checkpoint import Snapshot
from modelfleet.plan.inventory import resolve
from modelfleet.plan.planner import plan_capacity
from tests.helpers.recipe_pools import CATALOG, PIN, RECIPE_BOARDS, pool


def flags(argv: list[str]) -> list[str]:
    return [f for f in (grammar.flag_name(a) for a in argv) if f]


@pytest.mark.parametrize("recipe_id,hardware", RECIPE_BOARDS, ids=[f"{r}@{h}" for r, h in RECIPE_BOARDS])
def test_recipe_renders_the_plans_memory_fraction_and_no_flag_twice(recipe_id, hardware):
    result = pool(recipe_id, hardware)
    assert result.errors == [], result.errors
    recipe = CATALOG.recipes[recipe_id]
    for plan in result.hosts.values():
        svc = plan.services[0]
        engine_argv = render.engine_argv(svc)
        seen = flags(engine_argv)
        assert len(seen) == len(set(seen)), sorted(f for f in seen if seen.count(f) > 1)
        repeatable = {"-v", "--device", "--group-add", "--cap-drop"}
        docker = [f for f in flags(render.docker_run_argv(svc)[:render.docker_run_argv(svc).index(svc.image)])
                  if f not in repeatable]
        assert len(docker) == len(set(docker)), docker
        report = plan_capacity(svc.model, svc.hardware, gpus=svc.gpus, nodes=svc.nnodes, recipe=svc.recipe)
        flag = svc.engine.memory_fraction_flag
        if flag:
            assert float(engine_argv[engine_argv.index(flag) + 1]) == report.memory_fraction
        assert recipe.engine_version


def test_images_without_a_version_in_their_tag_are_paired_with_the_checked_version():
    for recipe in CATALOG.recipes.values():
        tag = recipe.image.rsplit(":", 1)[-1]
        assert recipe.engine_version, recipe.id
        if not any(ch.isdigit() for ch in tag):
            assert recipe.engine_version[0].isdigit() or recipe.engine_version.startswith("b"), recipe.id


def test_render_shows_the_checked_version_and_the_memory_fraction(tmp_path):
    inv = tmp_path / "inventories" / "k3.py"
    inv.parent.mkdir()
    inv.write_text(f"hosts = [('b300-01', {{'ssh_hostname': '192.0.2.5', 'hardware': 'b300', 'model': 'kimi-k3', "
                   f"'engine': 'vllm', 'recipe': 'kimi-k3-vllm-b300', 'revision': '{PIN}'}})]\n")
    out = CliRunner().invoke(main, ["render", str(inv), "b300-01"]).output
    assert "vllm/vllm-openai:kimi-k3: vllm flags checked with vllm 0.34.0's parser" in out
    assert "--gpu-memory-utilization 0.95" in out and "moonshotai/Kimi-K3" in out


def test_guides_k3_gb300_and_llamacpp_quantizations_render():
    for recipe_id, hardware in (("kimi-k3-vllm-gb300", "gb300"), ("kimi-k3-llamacpp-ud-q4-k-xl", "b300"),
                                ("kimi-k3-llamacpp-ud-iq1-m", "h200")):
        result = pool(recipe_id, hardware)
        assert result.errors == [], result.errors
    gb300 = pool("kimi-k3-vllm-gb300", "gb300")
    worker = render.engine_argv(gb300.hosts["n1"].services[0])
    assert "--headless" in worker and worker[worker.index("--node-rank") + 1] == "1"


def test_llamacpp_quantizations_fit_where_the_planner_says():
    k3 = CATALOG.models["kimi-k3"]
    q4 = CATALOG.recipes["kimi-k3-llamacpp-ud-q4-k-xl"]
    iq1m = CATALOG.recipes["kimi-k3-llamacpp-ud-iq1-m"]
    assert plan_capacity(k3, CATALOG.hardware["b300"], 8, recipe=q4).fits
    assert not plan_capacity(k3, CATALOG.hardware["b200"], 8, recipe=q4).fits
    assert plan_capacity(k3, CATALOG.hardware["h200"], 8, recipe=iq1m).fits
    assert plan_capacity(k3, CATALOG.hardware["b300"], 8, recipe=q4).disk_needed_bytes > 1.51e12 * 2


def test_a_required_recipe_parameter_is_named_with_where_to_get_it():
    data = {"hardware": "b300", "model": "kimi-k3", "engine": "sglang", "revision": PIN}
    errors = resolve([("h1", data)]).errors
    assert any(f == "recipe_params.mamba_full_memory_ratio" and "calculator" in m for _, f, m in errors), errors
    given = resolve([("h1", {**data, "recipe_params": {"mamba_full_memory_ratio": 0.6}})])
    assert given.errors == []
    argv = render.engine_argv(given.hosts["h1"].services[0])
    assert argv[argv.index("--mamba-full-memory-ratio") + 1] == "0.6"
    unknown = resolve([("h1", {**data, "recipe_params": {"mamba_full_memory_ratio": 0.6, "nope": 1}})])
    assert any(f == "recipe_params.nope" for _, f, _ in unknown.errors)


def test_gguf_recipe_fetches_only_its_quantization_and_loads_the_first_shard():
    from modelfleet.plan.pins import checkpoint_of, pinned_revision

    result = pool("kimi-k3-llamacpp-ud-iq1-m", "h200")
    plan = result.hosts["n0"]
    svc = plan.services[0]
    assert svc.hf_repo == "unsloth/Kimi-K3-GGUF" and svc.checkpoint_patterns == ("UD-IQ1_M/*",)
    files = {f"{quant}/Kimi-K3-{quant}-0000{i}-of-00003.gguf": {"size": 10, "sha256": "0" * 64, "blob_id": None}
             for quant in ("UD-IQ1_M", "UD-IQ1_S", "UD-Q4_K_XL") for i in (2, 1, 3)}
    files["README.md"] = {"size": 1, "sha256": None, "blob_id": "1" * 40}
    key = (svc.hf_repo, PIN, plan.model_source or plan.hf_endpoint)
    with runscope.scope():  # the hub's answer, as a run that resolved it holds it
        runscope.slot("snapshots", dict)[key] = Snapshot(repo=svc.hf_repo, revision=PIN, commit=PIN, files=files)
        assert sorted(checkpoint_of(plan, svc).files) == [f"UD-IQ1_M/Kimi-K3-UD-IQ1_M-0000{i}-of-00003.gguf"
                                                          for i in (1, 2, 3)]
        pinned = pinned_revision(plan, svc)
    assert pinned.model_file == "UD-IQ1_M/Kimi-K3-UD-IQ1_M-00001-of-00003.gguf"
    assert "/model/UD-IQ1_M/Kimi-K3-UD-IQ1_M-00001-of-00003.gguf" in render.engine_argv(pinned)
