import re

from modelfleet.plan.catalog import load_catalog

CAT = load_catalog()


def test_every_recipe_has_provenance_and_known_references():
    for recipe in CAT.recipes.values():
        assert recipe.source.strip(), recipe.id
        assert isinstance(recipe.verified, bool)
        assert recipe.model in CAT.models, recipe.id
        assert recipe.engine in CAT.engines, recipe.id
        assert set(recipe.hardware) <= set(CAT.hardware), recipe.id


def test_recipe_flags_are_long_options_with_values_as_strings():
    for recipe in CAT.recipes.values():
        assert not recipe.args or recipe.args[0].startswith("--"), recipe.id  # none: Ollama's server takes none
        assert all(isinstance(a, str) for a in recipe.args), recipe.id


def test_the_guides_b300_vllm_recipe_carries_its_flags():
    args = " ".join(CAT.recipes["kimi-k3.1-pro-vllm-b300"].args)
    for flag in ("--tensor-parallel-size 8", "--trust-remote-code", "--load-format fastsafetensors",
                 "--enable-auto-tool-choice", "--tool-call-parser kimi_k3", "--reasoning-parser kimi_k3",
                 "--max-model-len 32768"):
        assert flag in args
    assert CAT.recipes["kimi-k3.1-pro-vllm-b300"].env == {"VLLM_ENGINE_READY_TIMEOUT_S": "3600"}


def test_h200_hbm_is_the_measured_figure():
    assert CAT.hardware["h200"].hbm_mib == 143771
    assert CAT.hardware["h200"].allreduce_busbw_gbps == 431
    assert CAT.hardware["h100"].allreduce_busbw_gbps == 460
    assert CAT.hardware["mi300x"].allreduce_busbw_gbps == 314


def test_model_facts_from_the_guides():
    k31 = CAT.models["kimi-k3.1-pro"]
    assert (k31.params_total, k31.params_active, k31.layers, k31.context_max) == (2.8e12, 104e9, 93, 1048576)
    assert k31.experts == dict(routed=896, selected_per_token=16, shared=2)
    assert re.fullmatch(r"moonshotai/Kimi-K3\.1-Pro", k31.hf_repo)



def test_the_catalog_reads_the_same_as_pyyamls_safe_loader(tmp_path):
    """Every shipped file gives the data PyYAML's own safe loader gives; broken YAML is named with its line."""
    from pathlib import Path

    import pytest
    import yaml

    from modelfleet.plan import catalog

    files = sorted(Path(catalog.__file__).parent.rglob("*.yaml"))
    assert len(files) > 20
    for path in files:
        assert catalog.read_yaml(path.read_text()) == yaml.safe_load(path.read_text()), path
    broken = tmp_path / "site.yaml"
    broken.write_text("id: a\nargs: [1\n")
    with pytest.raises(catalog.CatalogError, match=r"site\.yaml:3: not valid YAML"):
        catalog._read(broken, catalog.SiteRecipe)
