"""The checkpoint's listing, resolved on the control node before any host fetches it."""

import json

import pytest

from modelfleet.plan import checkpoint

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def mirror_with(tmp_path, files: dict) -> str:
    folder = tmp_path / "org" / "model" / COMMIT
    folder.mkdir(parents=True)
    (folder / checkpoint.MANIFEST).write_text(json.dumps({"repo": "org/model", "commit": COMMIT, "files": files}))
    return f"file://{tmp_path}"


@pytest.mark.parametrize("bad", ["../../etc/cron.d/x", "/etc/passwd", "weights/../../x"])
def test_a_listing_naming_a_file_outside_the_revision_is_refused_before_any_host_fetches(tmp_path, bad):
    source = mirror_with(tmp_path, {"config.json": {"size": 2}, bad: {"size": 1}})
    with pytest.raises(checkpoint.ModelSourceError, match="lists files outside its folder"):
        checkpoint.snapshot("org/model", COMMIT, "https://hub.invalid", "HF_TOKEN", source)


def test_a_listing_inside_the_revision_resolves(tmp_path):
    source = mirror_with(tmp_path, {"config.json": {"size": 2}, "weights/model.safetensors": {"size": 9}})
    snap = checkpoint.snapshot("org/model", COMMIT, "https://hub.invalid", "HF_TOKEN", source)
    assert (snap.commit, sorted(snap.files)) == (COMMIT, ["config.json", "weights/model.safetensors"])
