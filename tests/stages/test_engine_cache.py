"""The engine_cache stage's decisions: which hosts hold a warm cache, whether a holder's index still lists its
files as they are, and which directories a host's services share (the whole copy: tests/lab)."""

from modelfleet.plan.inventory import resolve
from modelfleet.run.stages import engine_cache

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



def test_ranks_of_a_pool_get_every_cache_or_none_and_the_line_says_which():
    # vLLM #57423: a rank that skips FlashInfer's autotuning while the others run it hangs the pool at start.
    assert engine_cache.pool_verdict("pair", {"pa": True, "pb": True}) == (
        "identical", [], "pool pair: engine caches: every rank holds its cache (pa, pb)")
    assert engine_cache.pool_verdict("pair", {"pa": False, "pb": False})[:2] == ("none", [])
    assert engine_cache.pool_verdict("pair", {"pa": True, "pb": False}) == ("none", ["pa"], (
        "pool pair: engine caches differ between ranks (warm on pa; empty on pb): set aside on pa (kept as "
        "<key>.modelfleet-set-aside), every rank compiles (ranks that see different caches hang at start)"))


def test_a_warm_rank_is_set_aside_whole_its_key_file_kept_and_links_moved_not_followed(tmp_path):
    import subprocess

    from modelfleet.plan.caches import KEY_FILE

    key = tmp_path / "root" / "abc123"
    (key / "flashinfer").mkdir(parents=True)
    (key / "flashinfer" / "autotune.json").write_text("{}")
    (key.parent / f"{key.name}{KEY_FILE}").write_text("{}\n")  # beside its directory (caches.KEY_FILE)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    (key / "planted").symlink_to(outside)

    def sh(command):
        return subprocess.run(str(command), shell=True, capture_output=True, text=True)

    assert sh(engine_cache._warm_now(str(key))).stdout.strip() == "1"
    assert sh(engine_cache.set_aside_command(str(key))).returncode == 0
    aside = tmp_path / "root" / "abc123.modelfleet-set-aside"
    assert list(key.iterdir()) == [] and (key.parent / f"{key.name}{KEY_FILE}").exists()
    assert (aside / "flashinfer" / "autotune.json").exists() and (aside / "planted").is_symlink()
    assert (outside / "keep").read_text() == "x"  # the link moved, its target untouched
    assert sh(engine_cache._warm_now(str(key))).stdout.strip() == "0"
    assert sh(engine_cache.set_aside_command(str(key))).returncode == 0  # again: the last set-aside replaced
    assert not (aside / "flashinfer").exists()


def test_a_pool_whose_ranks_disagree_sets_the_warm_rank_aside_before_it_starts(fake, caplog, tmp_path, monkeypatch):
    from modelfleet.run.pipeline import run_stages
    from tests.stages.test_service import _pool_hosts

    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    hosts = _pool_hosts(fake)
    hosts[0][1]["fake_responses"]["-print -quit"] = ["1"]  # pa's rank kept its cache, pb's is new
    hosts[1][1]["fake_responses"]["-print -quit"] = ["0"]
    state = fake.run_fake(hosts, lambda: run_stages(engine_cache))
    moved = [c for c in fake.executed(state, "pa") if "modelfleet-set-aside" in c]
    assert len(moved) == 1 and not [c for c in fake.executed(state, "pb") if "modelfleet-set-aside" in c]
    assert ("modelfleet: pool pair: engine caches differ between ranks (warm on @fake/pa; empty on @fake/pb): set "
            "aside on @fake/pa") in caplog.text
    assert state.failed_hosts == set()
