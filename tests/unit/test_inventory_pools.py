"""The pools the services form (modelfleet.plan.inventory.pools): members held to one layout, ranks in host order, and
the warnings a pool earns."""

from modelfleet.plan.inventory import resolve

PIN = "a" * 40


def test_layout_must_match_pool_gpus():
    # The GB300 recipe is TP8 over two 4-GPU trays: one tray alone is not the layout.
    errors = resolve([("t1", {"hardware": "gb300", "model": "kimi-k3.1-pro", "engine": "vllm",
                              "revision": PIN, "pool": "g"})]).errors
    assert ("pool g", "hosts") in {(w, f) for w, f, _ in errors}
    assert ("pool g", "gpus") in {(w, f) for w, f, _ in errors}
    ok = resolve([(n, {"hardware": "gb300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": PIN,
                       "pool": "g"}) for n in ("t1", "t2")])
    assert ok.errors == []
    ranks = [ok.hosts[n].services[0].node_rank for n in ("t1", "t2")]
    assert ranks == [0, 1] and ok.hosts["t2"].services[0].head_address == "t1"


def test_a_pool_on_an_image_of_another_engine_version_than_its_recipe_is_warned():
    ok = resolve([("q", {"hardware": "h200", "model": "qwen3-8b", "engine": "vllm", "pool": "q"})])
    assert ok.errors == [] and not [w for w in ok.warnings if w[:2] == ("pool q", "image")]
    version = ok.hosts["q"].services[0].recipe.engine_version.lstrip("v")
    odd = resolve([("q", {"hardware": "h200", "model": "qwen3-8b", "engine": "vllm", "pool": "q",
                          "image": "vllm/vllm-openai:v0.1.0"})])
    assert version != "0.1.0"
    assert [m for w, f, m in odd.warnings if (w, f) == ("pool q", "image")] == [
        f"vllm/vllm-openai:v0.1.0 is vllm 0.1.0, but recipe {odd.hosts['q'].services[0].recipe.id}'s flags were "
        f"checked with {odd.hosts['q'].services[0].recipe.engine_version}"]


def test_a_pool_with_unequal_gpus_per_host_is_refused_naming_hosts_and_counts():
    # NCCL #2385: 7 + 8 ranks hang at init; the plan refuses before any host is touched.
    errors = resolve([("t1", {"hardware": "gb300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": PIN,
                              "pool": "g"}),
                      ("t2", {"hardware": "gb300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": PIN,
                              "pool": "g", "gpus": 3})]).errors
    said = [m for w, f, m in errors if (w, f) == ("pool g", "gpus")]
    assert said and said[0].startswith("unequal GPUs per host (declared): t1 4, t2 3: NCCL hangs at init")
