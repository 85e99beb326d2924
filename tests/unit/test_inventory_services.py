"""One service entry -> its plan (modelfleet.plan.inventory.services): the host's service keys under the entry's own,
the catalog's model, engine and recipe, and every problem of the entry named by host and field."""

from modelfleet.plan.catalog import load_catalog
from modelfleet.plan.inventory import HostData, resolve
from modelfleet.plan.inventory.services import resolve_service, service_entries

PIN = "a" * 40


def b300(**extra):
    return {"hardware": "b300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": PIN,
            "pool": "k31", **extra}


def test_host_level_service_keys_are_every_entrys_defaults_and_an_entrys_own_value_wins():
    data = {"hardware": "h200", "engine": "vllm", "image": "site/vllm:1",
            "services": [{"model": "qwen3-8b", "pool": "a"}, {"model": "qwen3-8b", "pool": "b", "image": "own:2"}]}
    assert service_entries(data) == [{"engine": "vllm", "image": "site/vllm:1", "model": "qwen3-8b", "pool": "a"},
                                     {"engine": "vllm", "image": "own:2", "model": "qwen3-8b", "pool": "b"}]
    # No `services`: the host's service keys are its one service.
    assert service_entries({"hardware": "h200", "model": "qwen3-8b", "engine": "vllm"}) == [
        {"model": "qwen3-8b", "engine": "vllm"}]


def test_an_entry_naming_an_unknown_model_gives_no_plan_and_says_which_field():
    cat = load_catalog()
    errors: list = []
    host = HostData(hardware="h200")
    assert resolve_service("n", host, cat.hardware["h200"], {"model": "nope", "engine": "vllm"}, cat, errors) is None
    assert [(w, f) for w, f, _ in errors] == [("host n", "model")]
    errors.clear()
    plan = resolve_service("n", host, cat.hardware["h200"], {"model": "qwen3-8b", "engine": "vllm",
                                                              "served_name": "q"}, cat, errors)
    assert errors == [] and plan.served_name == "q" and plan.port == 8000 and plan.unit_stem == "q"


def test_trust_remote_code_needs_a_pinned_commit():
    errors = resolve([("x", b300(revision="main"))]).errors
    assert [(w, f) for w, f, _ in errors] == [("host x", "revision")]


def test_rocm_recipe_on_nvidia_host_is_a_vendor_mismatch():
    errors = resolve([("n", {"hardware": "b300", "model": "kimi-k3", "engine": "vllm", "revision": PIN,
                             "recipe": "kimi-k3-vllm-mi355x"})]).errors
    assert any(f == "recipe" for _, f, _ in errors)
