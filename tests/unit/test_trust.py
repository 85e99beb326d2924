"""Where trust starts: the hub token and a model's own code never cross the network in clear; every vendor
repository has a pinned key with its source; the commands a run sends check the key before apt may trust it
(run here for real: curl from a file:// URL, dpkg-deb, the check, against gpg-made keys)."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from pyinfra.api import deploy

from modelfleet.host.os.debian import key_fetched, repo_package
from modelfleet.plan import trust
from modelfleet.plan.inventory.resolver import resolve

HOST = {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm"}


def errors(**data):
    return [(f, m) for _, f, m in resolve([("h1", {**HOST, **data})]).errors]


def test_token_never_over_plain_http_except_loopback_or_listed():
    [(fld, message)] = errors(hf_endpoint="http://hub.site:8080")
    assert fld == "hf_endpoint" and "in clear" in message and "insecure_http_hosts" in message
    assert errors(hf_endpoint="http://hub.site:8080", insecure_http_hosts=["hub.site"]) == []
    assert errors(hf_endpoint="http://hub.site:8080", insecure_http_hosts=["hub.site:8080"]) == []
    assert errors(hf_endpoint="http://hub.site:8080", insecure_http_hosts=["hub.site:9"]) != []
    for url in ("https://hub.site", "http://127.0.0.1:9", "http://localhost:8080", "http://[::1]:80"):
        assert errors(hf_endpoint=url) == [], url


def test_the_hub_endpoint_from_the_environment_is_held_to_it(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.site")
    assert [f for f, _ in errors()] == ["hf_endpoint"]


def test_code_never_from_a_plain_http_mirror_even_listed():
    code = {"trust_remote_code": True, "revision": "a" * 40}
    [(fld, message)] = errors(model_source="http://mirror.site/m", insecure_http_hosts=["mirror.site"], **code)
    assert fld == "model_source" and "tiny-lab runs its own code" in message
    assert errors(model_source="http://mirror.site/m", **{**code, "trust_remote_code": False}) == []
    assert errors(model_source="http://127.0.0.1:8/m", **code) == []
    assert errors(model_source="file:///srv/mirror", **code) == []
    assert [f for f, _ in errors(hf_endpoint="http://hub.site", insecure_http_hosts=["hub.site"], **code)] == \
        ["hf_endpoint"]


def test_url_credentials_in_the_message_are_masked():
    [(_, message)] = errors(hf_endpoint="http://user:pw-secret-1@hub.site")
    assert "pw-secret-1" not in message and "********@hub.site" in message


def test_every_repository_pinned_with_a_source():
    keys = trust.signing_keys()
    assert set(keys) == set(trust.REPOSITORIES)
    for repo, entry in keys.items():
        assert entry["fingerprints"] and all(re.fullmatch(r"[0-9A-F]{40}", f) for f in entry["fingerprints"]), repo
        assert "https://" in entry["source"], repo


def test_site_fingerprints_replace_the_catalogs_per_repository():
    site = {"docker": ["ab" * 20]}
    pins = trust.pinned(site)
    assert trust.expected(pins, "docker") == ("AB" * 20,)
    assert trust.expected(pins, "cuda") == tuple(trust.signing_keys()["cuda"]["fingerprints"])
    plan = resolve([("h1", {**HOST, "hardware": "h200", "model": "qwen3-8b", "recipe": None,
                            "repo_key_fingerprints": site})])
    assert trust.expected(plan.hosts["h1"].stack.repo_key_fingerprints, "docker") == ("AB" * 20,)


# --- the commands the run sends, run here --------------------------------------------------------------------

needs_tools = pytest.mark.skipif(not all(map(shutil.which, ("gpg", "curl", "dpkg-deb"))),
                                 reason="gpg, curl and dpkg-deb")


@pytest.fixture(scope="module")
def two_keys(tmp_path_factory):
    home = tmp_path_factory.mktemp("gnupg")
    home.chmod(0o700)
    out = {}
    for name in ("vendor", "attacker"):
        run = ["gpg", "--homedir", str(home), "--batch", "--yes", "--quiet"]
        subprocess.run(run + ["--passphrase", "", "--quick-gen-key", f"{name} <{name}@example.invalid>", "ed25519",
                              "sign", "never"], check=True, capture_output=True)
        armored = subprocess.run(run + ["--armor", "--export", f"{name}@example.invalid"], check=True,
                                 capture_output=True).stdout
        binary = subprocess.run(run + ["--export", f"{name}@example.invalid"], check=True, capture_output=True).stdout
        listing = subprocess.run(run + ["--with-colons", "--list-keys", f"{name}@example.invalid"], check=True,
                                 capture_output=True, text=True).stdout
        out[name] = (armored, binary, re.search(r"^fpr:+([0-9A-F]+):", listing, re.M).group(1))
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], capture_output=True)
    return out


def commands(fake, op, **kwargs) -> list[str]:
    @deploy("trust test")
    def one():
        op(name="op", **kwargs)

    state = fake.run_fake([("h", {})], one, dry=True)
    return fake.planned(state, "h")


@needs_tools
@pytest.mark.parametrize("served,ok", [("vendor", True), ("attacker", False)])
def test_key_fetched_places_only_the_pinned_key(fake, tmp_path, two_keys, served, ok):
    (tmp_path / "gpg").write_bytes(two_keys[served][0])
    dest = tmp_path / "keyrings" / "docker.asc"
    cmds = commands(fake, key_fetched, url=f"file://{tmp_path}/gpg", dest=str(dest), current=None, repo="docker",
                    fingerprints=(two_keys["vendor"][2],))
    done = subprocess.run(" && ".join(cmds), shell=True, capture_output=True, text=True)
    assert (done.returncode == 0) == ok, done.stderr
    assert dest.exists() == ok and not Path(f"{dest}.tmp").exists()
    if not ok:
        assert f"expected {two_keys['vendor'][2]}" in done.stderr and f"found {two_keys['attacker'][2]}" in done.stderr


@needs_tools
@pytest.mark.parametrize("served,ok", [("vendor", True), ("attacker", False)])
def test_keyring_package_checked_before_install(fake, tmp_path, two_keys, served, ok):
    """A cuda-keyring .deb carrying another key is refused before apt-get install (not run here)."""
    root = tmp_path / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text("Package: mf-test-keyring\nVersion: 1.0-1\nArchitecture: all\n"
                                             "Maintainer: t <t@example.invalid>\nDescription: test\n")
    keyring = root / "usr/share/keyrings/cuda-archive-keyring.gpg"
    keyring.parent.mkdir(parents=True)
    keyring.write_bytes(two_keys[served][1])
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(tmp_path / "k.deb")], check=True,
                   capture_output=True)
    package = f"mf-test-keyring-{served}-{tmp_path.name}"
    cmds = commands(fake, repo_package, package=package, url=f"file://{tmp_path}/k.deb", current={},
                    keyring="/usr/share/keyrings/cuda-archive-keyring.gpg", repo="cuda",
                    fingerprints=(two_keys["vendor"][2],))
    # apt-get as a stand-in that records what it was asked to install (the real one would install it here)
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "apt-get").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/apt-get.log\n")
    (fake_bin / "apt-get").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}"}
    done = subprocess.run(" && ".join(cmds), shell=True, capture_output=True, text=True, env=env)
    asked = (tmp_path / "apt-get.log").read_text() if (tmp_path / "apt-get.log").exists() else ""
    assert (done.returncode == 0) == ok, done.stderr
    assert (f"{package}.deb" in asked) == ok  # the attacker's keyring never reaches apt
    if not ok:
        assert "cuda" in done.stderr and f"found {two_keys['attacker'][2]}" in done.stderr
