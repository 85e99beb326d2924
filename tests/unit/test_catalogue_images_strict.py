"""`validate --strict` on every shipped recipe served as shipped: the image tag its guide publishes (vLLM's
`kimi-k3`, llama.cpp's `server-cuda13`, SGLang's `v0.5.18` beside flags checked with 0.5.23) is the catalogue's
fact, said as information with the command that shows the digest the run pins, not a warning `--strict` refuses.
An image the site chooses is still held to the recipe's engine version."""

import pytest

from modelfleet.plan.catalog import load_catalog
from modelfleet.plan.inventory import resolve

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SHIPPED = sorted(r.id for r in load_catalog().recipes.values() if r.image)


def served_as_shipped(recipe_id: str, **extra) -> list:
    r = load_catalog().recipes[recipe_id]
    return [(f"h{i}", {"hardware": r.hardware[0], "model": r.model, "engine": r.engine, "recipe": r.id,
                       "revision": COMMIT, "pool": "p", "ssh_hostname": f"192.0.2.{i + 1}",
                       "fabric_address": f"10.9.0.{i + 1}", "gpu_stack": False, **extra})
            for i in range(r.layout.nodes)]


@pytest.mark.parametrize("recipe_id", SHIPPED)
def test_a_shipped_recipes_own_image_is_no_warning(recipe_id):
    result = resolve(served_as_shipped(recipe_id))
    assert [w for w in result.warnings if w[1] == "image"] == []
    recipe = load_catalog().recipes[recipe_id]
    said = [m for _, f, m in result.info if f == "image"]
    tag = recipe.image.rsplit(":", 1)[1]
    assert bool(said) == (recipe.engine_version.lstrip("v") not in tag), (said, result.errors)
    for message in said:
        assert message.startswith(f"{recipe.image}, the image recipe {recipe_id} ships, ")
        assert "`modelfleet render --pin INVENTORY HOST` shows it" in message


def test_the_guides_tags_are_said_as_information_and_pinned_by_digest_they_stay_the_catalogues():
    said = {w[2] for w in resolve(served_as_shipped("kimi-k3-vllm-b300")).info if w[1] == "image"}
    assert said == {"vllm/vllm-openai:kimi-k3, the image recipe kimi-k3-vllm-b300 ships, names no engine version; "
                    "its flags were checked with vllm 0.34.0's parser. The run pins this tag's digest when it "
                    "starts: `modelfleet render --pin INVENTORY HOST` shows it, `image: <that reference>` keeps it"}
    digest = "vllm/vllm-openai:kimi-k3@sha256:" + "0" * 64  # a test value: only its form matters here
    pinned = resolve(served_as_shipped("kimi-k3-vllm-b300", image=digest))
    assert not [w for w in pinned.warnings if w[1] == "image"] and [i for i in pinned.info if i[1] == "image"]
    mirrored = resolve(served_as_shipped("kimi-k3-vllm-b300", image_registry="mirror.example:5000"))
    assert not [w for w in mirrored.warnings if w[1] == "image"]


def test_an_image_the_site_chooses_is_still_held_to_the_recipes_engine_version():
    nightly = resolve(served_as_shipped("kimi-k3-vllm-b300", image="vllm/vllm-openai:nightly")).warnings
    assert [w[2] for w in nightly if w[1] == "image"] == [
        "vllm/vllm-openai:nightly names no engine version: its flags were checked with vllm 0.34.0's parser; pin "
        "an image of that version"]
    older = resolve(served_as_shipped("kimi-k3-vllm-b300", image="vllm/vllm-openai:v0.33.0")).warnings
    assert [w[2] for w in older if w[1] == "image"] == [
        "vllm/vllm-openai:v0.33.0 is vllm 0.33.0, but recipe kimi-k3-vllm-b300's flags were checked with 0.34.0"]
