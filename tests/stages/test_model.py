"""The model stage's pure decisions: what a host's copy lacks (checkpoint.missing_files, read from the
manifest a full check wrote) which old revisions are pruned, and who copies from whom (fanout_waves)."""

from modelfleet.checkpoint import Snapshot, missing_files
from modelfleet.stages.model import _to_prune, fanout_waves

C, OLD, OLDER = "c" * 40, "d" * 40, "e" * 40


def snap() -> Snapshot:
    files = {"config.json": {"size": 10, "sha256": None}, "model.safetensors": {"size": 100, "sha256": "f" * 64}}
    return Snapshot(repo="org/m", revision="main", commit=C, files=files)


def tree(files: dict, manifest_files: dict, commit: str = C) -> dict:
    return {"files": files, "manifest": {"commit": commit, "files": manifest_files}}


def test_a_verified_copy_lacks_nothing_and_a_reverify_rechecks_everything():
    verified = tree({"config.json": [10, 5.0], "model.safetensors": [100, 6.0]},
                    {"config.json": {"size": 10, "mtime": 5.0}, "model.safetensors": {"size": 100, "mtime": 6.0}})
    assert missing_files(verified, snap()) == []
    assert missing_files(verified, snap(), reverify=True) == ["config.json", "model.safetensors"]


def test_a_file_touched_truncated_or_absent_since_its_check_is_fetched_again():
    manifest = {"config.json": {"size": 10, "mtime": 5.0}, "model.safetensors": {"size": 100, "mtime": 6.0}}
    assert missing_files(tree({"config.json": [10, 7.0], "model.safetensors": [100, 6.0]}, manifest),
                         snap()) == ["config.json"]
    assert missing_files(tree({"config.json": [10, 5.0], "model.safetensors": [50, 6.0]}, manifest),
                         snap()) == ["model.safetensors"]
    assert missing_files(tree({"config.json": [10, 5.0]}, manifest), snap()) == ["model.safetensors"]


def test_a_manifest_of_another_commit_vouches_for_nothing():
    other = tree({"config.json": [10, 5.0]}, {"config.json": {"size": 10, "mtime": 5.0}}, commit=OLD)
    assert missing_files(other, snap()) == ["config.json", "model.safetensors"]


def test_pruning_keeps_the_new_revision_the_one_current_names_and_keep_minus_one_others():
    revisions = [C, OLD, OLDER]  # newest first, as `ls -t` lists them
    assert _to_prune({"revisions": revisions, "current": OLD}, C, keep=1) == [OLDER]
    assert _to_prune({"revisions": revisions, "current": C}, C, keep=1) == [OLDER]
    assert _to_prune({"revisions": revisions, "current": C}, C, keep=2) == []


def test_fanout_waves_serve_at_most_width_peers_per_holder_and_grow_as_a_tree():
    members = [f"h{i}" for i in range(12)]
    waves = fanout_waves(members, {"h0"}, 2)
    assert waves[0] == {"h1": "h0", "h2": "h0"}
    assert waves[1] == {"h3": "h2", "h4": "h2", "h5": "h1", "h6": "h1", "h7": "h0", "h8": "h0"}
    assert waves[2] == {"h9": "h8", "h10": "h8", "h11": "h7"}  # the newest holders: the seed rests
    copied = [target for wave in waves for target in wave]
    assert sorted(copied) == sorted(members[1:])  # each missing host exactly once
    for number, wave in enumerate(waves):
        holders = {"h0"} | {t for earlier in waves[:number] for t in earlier}
        assert set(wave.values()) <= holders  # a source holds a verified copy before its wave
        assert max(list(wave.values()).count(s) for s in set(wave.values())) <= 2


def test_fanout_waves_take_log_n_waves_and_the_width_of_a_star_takes_one():
    members = [f"h{i}" for i in range(1000)]
    assert len(fanout_waves(members, {"h0"}, 8)) == 4  # 9, 81, 729, then the rest
    assert len(fanout_waves(members, {"h0"}, 999)) == 1
    assert fanout_waves(members[:5], set(members[:5]), 8) == []  # nothing missing: no wave


def test_hosts_that_already_hold_the_checkpoint_serve_from_the_first_wave():
    waves = fanout_waves(["a", "b", "c", "d", "e"], {"a", "c"}, 1)
    assert waves == [{"b": "c", "d": "a"}, {"e": "d"}]
