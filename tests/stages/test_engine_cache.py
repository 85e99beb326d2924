"""The engine_cache stage's decisions: which hosts hold a warm cache, whether a holder's index still lists its
files as they are, and which directories a host's services share (the whole copy: tests/lab)."""

from modelfleet.inventory import resolve
from modelfleet.stages import engine_cache

PIN = "b" * 40


def manifest(files: dict) -> dict:
    return {"files": {rel: {"size": size, "mtime": mtime, "sha256": "0" * 64} for rel, (size, mtime) in files.items()}}


def test_a_cache_is_warm_when_its_directory_has_files():
    assert not engine_cache.warm(None) and not engine_cache.warm({"files": {}, "manifest": None})
    assert engine_cache.warm({"files": {"inductor/a.py": [10, 1.5]}, "manifest": None})


def test_an_index_holds_only_while_it_lists_the_files_as_they_are():
    files = {"inductor/a.py": [10, 1700000000.123456], "triton/k.cubin": [99, 1700000001.5]}
    tree = {"files": files, "manifest": manifest(files)}
    assert engine_cache.indexed(tree)
    assert not engine_cache.indexed({**tree, "manifest": None})
    grown = {**files, "triton/new.cubin": [5, 1700000002.0]}  # the engine compiled a new shape since
    assert not engine_cache.indexed({"files": grown, "manifest": manifest(files)})
    rewritten = {**files, "triton/k.cubin": [99, 1700000009.0]}
    assert not engine_cache.indexed({"files": rewritten, "manifest": manifest(files)})
    # A link planted beside the indexed files (the tree's `odd` entries): indexed again, so the index refuses it.
    assert not engine_cache.indexed({**tree, "odd": ["l innocent.json"]})


def test_replicas_of_one_recipe_on_two_hosts_want_the_same_key_directory():
    data = {"hardware": "b300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": PIN,
            "image": "vllm/vllm-openai:v0.34.0@sha256:" + "f" * 64}
    hosts = resolve([("b300-01", {**data, "pool": "a"}), ("b300-02", {**data, "pool": "b", "port": 8001})]).hosts
    one, two = (engine_cache._caches(hosts[h]) for h in ("b300-01", "b300-02"))
    assert list(one) == list(two) and len(one) == 1
    wants = engine_cache.wants(hosts["b300-01"], {})
    cache = next(iter(one.values()))
    assert wants["trees"] == [cache.dir] and f"modelfleet-fanout-cache-{cache.key}.service" in wants["units"]

