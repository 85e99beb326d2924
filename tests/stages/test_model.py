"""The model stage's pure decisions: what a host's copy lacks (checkpoint.missing_files, read from the
manifest a full check wrote) and which old revisions are pruned (who copies from whom: tests/unit/test_transfer.py)."""

from modelfleet.plan.checkpoint import Snapshot, missing_files
from modelfleet.run.stages.model import _to_prune

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
