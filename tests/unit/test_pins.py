"""The pins a run resolves on the control node before any stage: image digests from the registry, checkpoint
commits from the hub or a mirror, and a failure as one line per host saying what to do. The registry is answered
by a stand-in for its HTTP exchange (registry._resolve); checkpoints come from a file:// mirror written here."""

import json

import pytest

from modelfleet.base import registry, runscope
from modelfleet.base.registry import RegistryError
from modelfleet.plan import checkpoint, pins
from modelfleet.plan.checkpoint import ModelSourceError
from modelfleet.plan.inventory import resolve
from tests.helpers.recipe_pools import PIN, pool

DIGEST = "sha256:" + "d" * 64
TINY = {"hardware": "h200", "gpu_count": 1, "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm"}
GGUF = "kimi-k3-llamacpp-ud-iq1-m"


@pytest.fixture
def asked(monkeypatch):
    """The images the registry is asked about; each answers DIGEST unless its name says `unreachable`."""
    images = []

    def resolve_(image, insecure, config):
        images.append(image)
        if "unreachable" in image:
            raise RegistryError(f"{image}: cannot reach the registry")
        return DIGEST

    monkeypatch.setattr(registry, "_resolve", resolve_)
    with runscope.scope():  # each test resolves its own checkpoints
        yield images


def mirror(tmp_path, repo: str, commit: str, files: list[str]) -> str:
    """A mirror folder holding one revision of `repo`, as modelfleet mirror writes it."""
    folder = tmp_path / repo / commit
    folder.mkdir(parents=True)
    listing = {"repo": repo, "commit": commit, "files": {f: {"size": 1, "sha256": "0" * 64} for f in files}}
    (folder / checkpoint.MANIFEST).write_text(json.dumps(listing))
    return f"file://{tmp_path}"


def one(data: dict):
    result = resolve([("h1", data)])
    assert result.errors == []
    plan = result.hosts["h1"]
    return plan, plan.services[0]


def test_an_image_by_tag_is_pinned_to_its_digest_and_one_by_digest_is_left_as_written(asked):
    plan, svc = one(TINY)
    assert pins.pinned_image(svc) == f"{svc.image}@{DIGEST}" and asked == [svc.image]
    _, by_digest = one({**TINY, "image": f"vllm/vllm-openai:v0.34.0@{DIGEST}"})
    assert pins.pinned_image(by_digest) == f"vllm/vllm-openai:v0.34.0@{DIGEST}" and asked == [svc.image]


def test_a_revision_already_a_commit_is_not_asked_about(asked, monkeypatch):
    def no_snapshot(*args):
        raise AssertionError("the hub was asked about a commit")

    monkeypatch.setattr(pins, "snapshot", no_snapshot)
    plan, svc = one({**TINY, "revision": PIN})
    pinned = pins.pinned_revision(plan, svc)
    assert pinned.revision == PIN and pinned.model_dir.endswith(f"/{PIN}")


def test_a_branch_resolves_to_the_commit_the_source_answers(asked, tmp_path):
    plan, svc = one({**TINY, "revision": "main"})
    commit = "e" * 40
    runscope.slot("snapshots", dict)[(svc.hf_repo, "main", plan.hf_endpoint)] = checkpoint.Snapshot(
        repo=svc.hf_repo, revision="main", commit=commit, files={"config.json": {"size": 2}})
    pinned = pins.pinned_service(plan, svc)
    assert (pinned.revision, pinned.image) == (commit, f"{svc.image}@{DIGEST}")
    assert pinned.model_dir != svc.model_dir and pinned.model_dir.endswith(f"/{commit}")


def test_a_gguf_recipe_loads_the_first_shard_of_its_quantization_from_the_mirror(asked, tmp_path):
    repo = pool(GGUF, "h200").hosts["n0"].services[0].hf_repo
    shards = [f"UD-IQ1_M/Kimi-K3-UD-IQ1_M-0000{i}-of-00003.gguf" for i in (3, 1, 2)]
    source = mirror(tmp_path, repo, PIN, [*shards, "UD-Q4_K_XL/Kimi-K3-UD-Q4_K_XL-00001-of-00002.gguf", "README.md"])
    plan = pool(GGUF, "h200", model_source=source).hosts["n0"]
    svc = plan.services[0]
    assert sorted(pins.checkpoint_of(plan, svc).files) == sorted(shards)  # only its quantization
    assert pins.pinned_revision(plan, svc).model_file == "UD-IQ1_M/Kimi-K3-UD-IQ1_M-00001-of-00003.gguf"


def test_a_gguf_pattern_matching_nothing_names_the_recipe(asked, tmp_path):
    repo = pool(GGUF, "h200").hosts["n0"].services[0].hf_repo
    source = mirror(tmp_path, repo, PIN, ["UD-Q4_K_XL/Kimi-K3-UD-Q4_K_XL-00001-of-00002.gguf"])
    plan = pool(GGUF, "h200", model_source=source).hosts["n0"]
    with pytest.raises(ModelSourceError, match=f"has no file matching .*recipe {GGUF}"):
        pins.pinned_revision(plan, plan.services[0])


def test_problems_are_one_line_per_failing_pin_saying_what_to_check(asked, tmp_path):
    from dataclasses import replace

    source = f"file://{tmp_path}"  # a mirror holds commits only: a branch cannot resolve there
    plan, svc = one({**TINY, "revision": PIN, "model_source": source, "image": "unreachable.site/engine:v1",
                     "dcgm_exporter": True})
    # validate refuses a branch with a mirror; the run's own pin says it too, for a plan made otherwise
    plan = replace(plan, services=(replace(svc, revision="main"),))
    lines = pins.problems(plan)
    assert len(lines) == 2, lines
    assert lines[0].startswith("image digest: unreachable.site/engine:v1: cannot reach")
    assert lines[0].endswith("check the registry (image_registry / network) and re-run")
    assert lines[1].startswith("checkpoint revision: ") and "needs `revision` pinned to a 40-hex commit" in lines[1]
    assert lines[1].endswith("check hf_endpoint / model_source and the token, then re-run")
    assert pins.problems(plan, images=False) == lines[1:]
    assert pins.problems(plan, revisions=False) == lines[:1]
    assert plan.dcgm_exporter_image in asked  # the exporter's image is pinned too, on NVIDIA hosts


def test_a_host_whose_pins_resolve_has_no_problems(asked, tmp_path):
    plan, svc = one({**TINY, "revision": PIN, "dcgm_exporter": True})
    assert pins.problems(plan) == []
    assert sorted(asked) == sorted([svc.image, plan.dcgm_exporter_image])
