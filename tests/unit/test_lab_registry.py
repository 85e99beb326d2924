"""A new lab's registry is seeded from the fullest other lab's of the checkout: blobs hard-linked, link files
copied, a registry that already has data left alone."""

import os

import lab


def registry(root, name, blobs):
    v2 = root / name / "registry" / "docker" / "registry" / "v2"
    for digest in blobs:
        (v2 / "blobs" / "sha256" / digest[:2] / digest).mkdir(parents=True)
        (v2 / "blobs" / "sha256" / digest[:2] / digest / "data").write_text(digest)
    link = v2 / "repositories" / "vllm" / "_manifests" / "tags" / "v1" / "current" / "link"
    link.parent.mkdir(parents=True)
    link.write_text(f"sha256:{blobs[0]}")
    return v2


def test_a_new_registry_starts_from_the_fullest_other_one(tmp_path, monkeypatch):
    registry(tmp_path, ".lab", ["aa01"])
    full = registry(tmp_path, ".lab-test", ["aa01", "bb02", "cc03"])
    monkeypatch.setattr(lab, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(lab, "STATE", tmp_path / ".lab-test2")
    data = tmp_path / ".lab-test2" / "registry"
    data.mkdir(parents=True)
    lab._seed_registry(data)
    v2 = data / "docker" / "registry" / "v2"
    blob = v2 / "blobs" / "sha256" / "bb" / "bb02" / "data"
    assert blob.read_text() == "bb02" and os.stat(blob).st_ino == os.stat(full / "blobs/sha256/bb/bb02/data").st_ino
    link = v2 / "repositories/vllm/_manifests/tags/v1/current/link"
    assert link.read_text() == "sha256:aa01"
    assert os.stat(link).st_ino != os.stat(full / "repositories/vllm/_manifests/tags/v1/current/link").st_ino
    link.write_text("sha256:other")  # the registry rewrites link files: the seed's own stay as they were
    assert (full / "repositories/vllm/_manifests/tags/v1/current/link").read_text() == "sha256:aa01"


def test_a_registry_with_data_is_left_alone(tmp_path, monkeypatch):
    registry(tmp_path, ".lab", ["aa01"])
    own = registry(tmp_path, ".lab-test", ["dd04"])
    monkeypatch.setattr(lab, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(lab, "STATE", tmp_path / ".lab-test")
    lab._seed_registry(tmp_path / ".lab-test" / "registry")
    assert sorted(p.name for p in (own / "blobs" / "sha256").iterdir()) == ["dd"]
