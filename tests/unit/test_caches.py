"""Engine caches: where they live, what keys them, what the unit and env file carry, and what pruning removes."""

import difflib
import json
import os
import statistics
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from modelfleet.plan import caches, render
from modelfleet.plan.catalog import load_catalog
from modelfleet.plan.inventory import resolve
from tests.helpers.made_keys import made_key

PIN = "b" * 40
DIGEST = "sha256:" + "f" * 64


def host(name="b300-01", **extra):
    data = {"hardware": "b300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": PIN, "pool": "k31",
            "image": f"vllm/vllm-openai:v0.34.0@{DIGEST}", **extra}
    result = resolve([(name, data)])
    assert result.errors == []
    return result.hosts[name]


def key(svc):
    return render.engine_cache(svc).key


def test_vllm_roots_point_into_the_keyed_directory_on_the_model_filesystem():
    svc = host().services[0]
    cache = render.engine_cache(svc)
    assert cache.root == "/srv/models/.cache/vllm" and len(cache.key) == 16
    argv = render.docker_run_argv(svc)
    mount = argv.index(f"{cache.dir}:/cache")
    assert argv[mount - 1] == "-v" and argv[mount - 2] == f"{svc.model_dir}:/model:ro"  # read-write, beside it
    assert "--rm" in argv
    env = render.render_env(svc)
    for line in ("VLLM_CACHE_ROOT=/cache/vllm", "TORCHINDUCTOR_CACHE_DIR=/cache/inductor",
                 "TRITON_CACHE_DIR=/cache/triton", "DG_JIT_CACHE_DIR=/cache/deep_gemm",
                 "FLASHINFER_WORKSPACE_BASE=/cache/flashinfer"):
        assert line + "\n" in env


def test_sglang_gets_its_own_deepgemm_variable_and_llama_cpp_gets_no_cache():
    sglang = resolve([("s", {"hardware": "b300", "model": "kimi-k3.1-pro", "engine": "sglang", "revision": PIN})])
    svc = sglang.hosts["s"].services[0]
    env = render.render_env(svc)
    assert "SGLANG_DG_CACHE_DIR=/cache/deep_gemm\n" in env and "VLLM_CACHE_ROOT" not in env
    assert f"{render.engine_cache(svc).root}" == "/srv/models/.cache/sglang"
    llama = resolve([("l", {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "llama.cpp"})])
    svc = llama.hosts["l"].services[0]
    assert render.engine_cache(svc) is None
    assert not any(a.endswith(":/cache") for a in render.docker_run_argv(svc))
    assert "/cache" not in render.render_env(svc)


def test_every_variable_the_catalog_names_is_one_the_engines_read():
    # Checked against the engines' sources (engines.yaml names them); a typo would silently cache nothing.
    known = {"VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "DG_JIT_CACHE_DIR",
             "FLASHINFER_WORKSPACE_BASE", "SGLANG_DG_CACHE_DIR"}
    for name, engine in load_catalog().engines.items():
        if engine.caches:
            assert engine.caches["source"] and set(engine.caches["env"]) <= known, name
            assert len(set(engine.caches["env"].values())) == len(engine.caches["env"]), name  # no two share


def test_the_key_changes_with_each_input_and_only_then():
    svc = host().services[0]
    base = key(svc)
    assert key(host().services[0]) == base  # the same plan, the same key
    assert key(host("b300-02").services[0]) == base  # another replica with the same everything: a copy fits
    b200 = load_catalog().hardware["b200"]
    changed = {
        "image digest": replace(svc, image=f"vllm/vllm-openai:v0.34.0@sha256:{'e' * 64}"),
        "GPU model": replace(svc, hardware=b200),
        "driver branch": replace(svc, driver_branch="590"),
        "revision": svc.at_commit("c" * 40),
        "argv": replace(svc, extra_args=("--max-num-seqs", "64")),
        "layout": replace(svc, recipe=svc.recipe.model_copy(
            update={"layout": svc.recipe.layout.model_copy(update={"ep": True})})),
        "rank": replace(svc, node_rank=1, nnodes=2),
    }
    keys = {what: key(s) for what, s in changed.items()}
    assert base not in keys.values() and len(set(keys.values())) == len(keys), keys
    # A retag of the same digest is the same image.
    assert key(replace(svc, image=f"vllm/vllm-openai:latest@{DIGEST}")) == base


def test_the_driver_branch_comes_from_the_host():
    assert host(driver_branch="590").services[0].driver_branch == "590"
    assert render.engine_cache(host(driver_branch="590").services[0]).inputs["driver_branch"] == "590"


def test_the_key_file_says_why_and_holds_no_secret(monkeypatch):
    key = made_key()
    monkeypatch.setenv("K31_KEY", key)
    svc = host(api_key_env="K31_KEY").services[0]
    cache = render.engine_cache(svc)
    written = json.loads(cache.key_json)
    assert written["key"] == cache.key == caches.key_of(written["inputs"])
    argv = render.engine_argv(svc)
    assert len(written["inputs"]["argv"]) == len(argv)
    assert [a for a in written["inputs"]["argv"] if a != caches.PLACEMENT] == [
        a for i, a in enumerate(argv) if argv[i - 1] not in ("--host", "--port")]
    assert written["inputs"]["image"] == DIGEST and written["inputs"]["revision"] == PIN
    assert written["inputs"]["gpu"] == "NVIDIA B300 SXM6 AC" and written["inputs"]["layout"]["tp"] == 8
    assert key not in cache.key_json


def test_root_writes_the_key_file_where_the_engines_container_cannot_plant_a_link():
    """The key file was written (then chowned and chmodded, as root) inside the directory the engine mounts
    read-write: a link planted under its name sent root's write, and a chmod 0644, to the link's target."""
    cache = render.engine_cache(host().services[0])
    mounted = caches.docker_flags(cache)[1].split(":")[0]
    assert mounted == cache.dir and not cache.key_file.startswith(f"{mounted}/")
    assert cache.key_file.rsplit("/", 1)[0] == cache.root


def test_the_inventory_env_wins_over_the_cache_roots():
    svc = host(env={"TRITON_CACHE_DIR": "/tmp/triton"}).services[0]
    env = render.env_values(svc)
    assert env["TRITON_CACHE_DIR"] == "/tmp/triton" and env["VLLM_CACHE_ROOT"] == "/cache/vllm"


def test_multinode_ranks_get_their_own_keys():
    data = {"hardware": "gb300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": "e" * 40, "pool": "k31"}
    resolved = resolve([("t1", {**data, "fabric_address": "10.0.0.1"}), ("t2", {**data, "fabric_address": "10.0.0.2"})])
    assert not resolved.errors, resolved.errors
    head, worker = (resolved.hosts[h].services[0] for h in ("t1", "t2"))
    assert key(head) != key(worker)
    assert render.engine_cache(worker).inputs["node_rank"] == 1


def test_replicas_on_other_addresses_and_pools_share_a_key_and_other_flags_still_change_it():
    # Where an engine listens, and where its pool meets, never reach a compiled kernel: two replicas of one
    # recipe on two hosts, or the same rank of two pools, can use each other's caches.
    a = host("b300-01", pool="k31-a", port=8001).services[0]
    b = host("b300-02", pool="k31-b", port=8002).services[0]
    assert render.engine_argv(a) != render.engine_argv(b) and key(a) == key(b)
    assert key(host("b300-03", pool="k31-c", extra_args=["--max-num-seqs", "64"]).services[0]) != key(a)
    data = {"hardware": "gb300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": "e" * 40}
    pools = resolve([(f"t{i}", {**data, "pool": f"p{i // 2}", "fabric_address": f"10.0.{i // 2}.{i % 2 + 1}"})
                     for i in range(4)])
    assert not pools.errors, pools.errors
    ranks = [pools.hosts[f"t{i}"].services[0] for i in range(4)]
    assert "10.0.0.1" in render.engine_argv(ranks[0]) and "10.0.1.1" in render.engine_argv(ranks[2])
    assert key(ranks[0]) == key(ranks[2]) and key(ranks[1]) == key(ranks[3]) and key(ranks[0]) != key(ranks[1])
    assert caches.placement_flags(load_catalog().engines["vllm"]) >= {"--host", "--port", "--master-addr",
                                                                     "--data-parallel-address"}
    assert caches.placement_flags(load_catalog().engines["sglang"]) >= {"--host", "--port", "--dist-init-addr"}


def test_stale_keys_are_only_key_directories_not_in_use():
    entries = [".modelfleet-owned", "0123456789abcdef", "fedcba9876543210", "aaaaaaaaaaaaaaaa", "notes",
               "0123456789ABCDEF", "0123456789abcdef0"]
    assert caches.stale_keys(entries, {"aaaaaaaaaaaaaaaa"}) == ["0123456789abcdef", "fedcba9876543210"]
    assert caches.stale_keys(None, set()) == []
    # A set-aside copy goes with its key, or alone once its key directory is gone; one of a key in use stays.
    aside = caches.SET_ASIDE
    entries = ["aaaaaaaaaaaaaaaa", f"aaaaaaaaaaaaaaaa{aside}", "0123456789abcdef", f"0123456789abcdef{aside}",
               f"fedcba9876543210{aside}", f"notakey{aside}"]
    assert caches.stale_keys(entries, {"aaaaaaaaaaaaaaaa"}) == ["0123456789abcdef", f"fedcba9876543210{aside}"]


@pytest.mark.parametrize("keep", [0, 1, 2])
def test_prune_command_keeps_the_newest_stale_keys(tmp_path, keep):
    names = [f"{i:016x}" for i in range(4)]
    now = time.time()
    for age, name in enumerate(names):  # names[0] is the newest
        (tmp_path / name / "inductor").mkdir(parents=True)
        (tmp_path / f"{name}{caches.KEY_FILE}").write_text("{}")
        os.utime(tmp_path / name, (now - 100 * age, now - 100 * age))
    (tmp_path / "in-use").mkdir()
    for name in names:  # each with the copy a pool's disagreeing ranks set aside
        (tmp_path / f"{name}{caches.SET_ASIDE}" / "inductor").mkdir(parents=True)
        os.utime(tmp_path / f"{name}{caches.SET_ASIDE}", (0, 0))
    command = caches.prune_command(str(tmp_path), names, keep)
    subprocess.run(command.get_raw_value(), shell=True, check=True)
    kept = [f"{name}{suffix}" for name in names[:keep] for suffix in ("", caches.KEY_FILE, caches.SET_ASIDE)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept + ["in-use"])


def test_the_h200_figures_in_the_docs_are_the_recordings():
    root = Path(__file__).resolve().parents[2]
    run = json.loads((root / "docs/measurements/hw-runs/compile-cache-h200x1-2026-12-04.json").read_text())

    def median(rows, key):
        return statistics.median(r[key] for r in rows)

    first = median(run["warm"], "first_call_s") / median(run["cold"], "first_call_s")
    wall = median(run["warm"], "wall_s") / median(run["cold"], "wall_s")
    assert round(first, 3) == run["warm_over_cold_first_call"] and round(wall, 3) == run["warm_over_cold_wall"]
    for doc in ("docs/engine-caches.md", "docs/measurements/hw-runs/README.md"):
        text = (root / doc).read_text()
        assert f"**{first:.3f} of cold**" in text, doc
        assert f"({wall:.3f})" in text or f"{wall:.3f} (imports" in text, doc
        assert f"{median(run['warm'], 'first_call_s'):.3f} s" in text, doc
        assert f"{median(run['cold'], 'first_call_s'):.3f} s" in text, doc


def test_the_unit_differs_only_by_the_mount_and_the_env_file_only_by_the_roots():
    svc = host().services[0]
    bare = replace(svc, engine=svc.engine.model_copy(update={"caches": {}}))

    def added(before, after):
        diff = list(difflib.ndiff(before.splitlines(), after.splitlines()))
        assert not [d for d in diff if d.startswith("- ")]
        return [d[2:] for d in diff if d.startswith("+ ")]

    cache = render.engine_cache(svc)
    assert added(render.render_unit(bare), render.render_unit(svc)) == [f"    -v {cache.dir}:/cache \\"]
    assert added(render.render_env(bare), render.render_env(svc)) == [
        f"{var}={path}" for var, path in sorted(cache.env.items())]
