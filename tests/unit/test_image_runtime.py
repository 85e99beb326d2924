"""An engine image's CUDA/ROCm (modelfleet.base.image_runtime): what a tag says where its publisher encodes it, a
recipe that contradicts its tag refused at catalog load, a service's own image that contradicts its recipe and
a driver branch too old for the image refused at resolve (naming host and field), what render says, and the
shipped catalog: every NVIDIA recipe names its CUDA with a source, llama.cpp's on the CUDA 13 tag the lab
serves too."""

import pytest
import yaml
from pydantic import ValidationError

import lab
from modelfleet.base import image_runtime
from modelfleet.plan.catalog import CATALOG_DIR, Recipe, load_catalog
from modelfleet.plan.inventory import resolve


@pytest.mark.parametrize("image,said", [
    ("ghcr.io/ggml-org/llama.cpp:server-cuda", ("cuda", "12")),
    ("ghcr.io/ggml-org/llama.cpp:server-cuda13", ("cuda", "13")),
    ("ghcr.io/ggml-org/llama.cpp:full-cuda13-b6000", ("cuda", "13")),
    ("vllm/vllm-openai:v0.34.0", ("cuda", "13")),
    ("127.0.0.1:5000/vllm/vllm-openai:v0.34.0@sha256:" + "0" * 64, ("cuda", "13")),  # a mirror, pinned
    ("vllm/vllm-openai:v0.34.0-cu129", ("cuda", "12.9")),
    ("vllm/vllm-openai:v0.11.0", None),  # before v0.20 the unsuffixed tag says nothing here
    ("lmsysorg/sglang:v0.5.18-cu130", ("cuda", "13.0")),
    ("lmsysorg/sglang:v0.5.18-rocm720-mi35x", ("rocm", "7.2.0")),
    ("lmsysorg/sglang:v0.5.18", None), ("vllm/vllm-openai:kimi-k3", None),
])
def test_what_a_tag_says(image, said):
    got = image_runtime.tag_runtime(image)
    assert (got[:2] if got else None) == said


def recipe_data(name: str, **changes) -> dict:
    return {**yaml.safe_load((CATALOG_DIR / "recipes" / f"{name}.yaml").read_text()), **changes}


def test_a_recipe_contradicting_its_tag_is_refused_at_load():
    with pytest.raises(ValidationError, match="cuda: 13.0 but image ghcr.io/ggml-org/llama.cpp:server-cuda is a "
                                              "CUDA 12 build"):
        Recipe.model_validate(recipe_data("kimi-k3-llamacpp-h200", image="ghcr.io/ggml-org/llama.cpp:server-cuda"))
    with pytest.raises(ValidationError, match=r"ROCm 7.2.0 build .*set `rocm: \"7.2.0\"` \(not `cuda`\)"):
        Recipe.model_validate(recipe_data("kimi-k3-sglang-b300", image="lmsysorg/sglang:v0.5.18-rocm720-mi35x"))
    assert Recipe.model_validate(recipe_data("kimi-k3-sglang-b300", image="lmsysorg/sglang:v0.5.18-cu130"))


HOST = {"hardware": "h200", "gpu_count": 1, "model": "qwen3-8b", "engine": "vllm", "pool": "p",
        "revision": "e" * 40}


def resolve_errors(**data) -> list[tuple]:
    errors = resolve([("h1", {**HOST, **data})]).errors
    return [(where, fld, msg) for where, fld, msg in errors if msg.startswith("recipe qwen3-8b-vllm-1gpu: ")]


def test_a_driver_too_old_or_an_image_contradicting_the_recipe_is_refused_naming_host_and_field():
    [(where, fld, msg)] = resolve_errors(driver_branch="570")
    assert (where, fld) == ("host h1", "driver_branch") and "570 serves CUDA 12.8" in msg and "R580" in msg
    [(where, fld, msg)] = resolve_errors(image="vllm/vllm-openai:v0.34.0-cu129")
    assert (where, fld) == ("host h1", "image") and "CUDA 12.9 build" in msg
    assert resolve_errors() == []  # R580 and the recipe's own image: fine


def test_render_says_the_recipe_s_word_the_tag_s_and_the_driver_s():
    note = image_runtime.render_note("ghcr.io/ggml-org/llama.cpp:server-cuda13", "13.0", None, "the tag", "nvidia",
                                     "580")
    assert note == ("image ghcr.io/ggml-org/llama.cpp:server-cuda13: built with CUDA 13.0 (recipe; source: the "
                    "tag); the tag says CUDA 13 (llama.cpp's server-cuda13 tag (-cuda: CUDA 12, -cuda13: CUDA 13))"
                    ": agrees; driver branch 580 serves CUDA 13.0: ok")
    assert "too old" in image_runtime.render_note("vllm/vllm-openai:kimi-k3", "13.0", None, None, "nvidia", "570")


def test_the_shipped_catalog_names_each_nvidia_image_s_cuda_with_its_source():
    cat = load_catalog()
    for recipe in cat.recipes.values():
        vendors = {cat.hardware[h].vendor for h in recipe.hardware}
        if recipe.id.startswith(("tiny-lab", "tiny-llama")):
            continue  # the lab's recipes: CPU images (doubles under the real tags, the real vLLM's CPU build)
        assert (recipe.cuda if vendors == {"nvidia"} else recipe.rocm) and recipe.runtime_source, recipe.id
        if recipe.engine == "llama.cpp":
            assert recipe.image.endswith(":server-cuda13"), recipe.id
    assert "ghcr.io/ggml-org/llama.cpp:server-cuda13" in lab.ENGINE_IMAGES  # the lab serves the tag they name
