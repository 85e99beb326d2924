"""The host's key check, against gpg's own fingerprints: RSA and Ed25519 keys, armoured and binary, one key or
a keyring of several; a key not pinned, a keyring that adds a second key, and a file that is no key are refused
with repository, expected and found named."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from modelfleet import FILES_DIR

sys.path.insert(0, str(FILES_DIR))
import key_fingerprint  # noqa: E402

pytestmark = pytest.mark.skipif(not shutil.which("gpg"), reason="gpg makes the keys and is the oracle")


def gpg(home: Path, *args: str) -> bytes:
    return subprocess.run(["gpg", "--homedir", str(home), "--batch", "--yes", "--quiet", *args], check=True,
                          capture_output=True).stdout


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    home = tmp_path_factory.mktemp("gnupg")
    home.chmod(0o700)
    for uid, algo in (("ed <ed@example.invalid>", "ed25519"), ("rsa <rsa@example.invalid>", "rsa2048")):
        gpg(home, "--passphrase", "", "--quick-gen-key", uid, algo, "sign", "never")
    listing = gpg(home, "--with-colons", "--list-keys").decode().splitlines()
    primaries = [listing[i + 1].split(":")[9] for i, line in enumerate(listing) if line.startswith("pub:")]
    files = {}
    for name, who in (("ed", "ed@example.invalid"), ("rsa", "rsa@example.invalid")):
        files[f"{name}.asc"] = gpg(home, "--armor", "--export", who)
        files[f"{name}.gpg"] = gpg(home, "--export", who)
    files["both.gpg"] = gpg(home, "--export")
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], capture_output=True)
    return dict(zip(("ed", "rsa"), primaries, strict=True)), files


def test_fingerprints_equal_gpgs(keys):
    fpr, files = keys
    assert key_fingerprint.fingerprints(files["ed.asc"]) == [fpr["ed"]]
    assert key_fingerprint.fingerprints(files["ed.gpg"]) == [fpr["ed"]]
    assert key_fingerprint.fingerprints(files["rsa.asc"]) == [fpr["rsa"]]
    assert sorted(key_fingerprint.fingerprints(files["both.gpg"])) == sorted(fpr.values())


def check(tmp_path, data: bytes, *expected: str):
    path = tmp_path / "key"
    path.write_bytes(data)
    return subprocess.run([sys.executable, str(FILES_DIR / "key_fingerprint.py"), str(path), "docker", *expected],
                          capture_output=True, text=True)


def test_pinned_key_passes_in_any_case_and_spacing(keys, tmp_path):
    fpr, files = keys
    spaced = " ".join(fpr["rsa"][i:i + 4] for i in range(0, 40, 4)).lower()
    assert check(tmp_path, files["rsa.asc"], spaced).returncode == 0


def test_other_key_refused_naming_repo_expected_and_found(keys, tmp_path):
    fpr, files = keys
    done = check(tmp_path, files["ed.asc"], fpr["rsa"])
    assert done.returncode == 1
    assert "docker" in done.stderr and f"expected {fpr['rsa']}" in done.stderr and f"found {fpr['ed']}" in done.stderr


def test_keyring_adding_a_second_key_refused(keys, tmp_path):
    fpr, files = keys
    assert check(tmp_path, files["both.gpg"], fpr["rsa"]).returncode == 1
    assert check(tmp_path, files["both.gpg"], fpr["rsa"], fpr["ed"]).returncode == 0


@pytest.mark.parametrize("data", [b"", b"<html>404</html>", b"\x99\x00"])
def test_not_a_key_refused(tmp_path, data):
    done = check(tmp_path, data, "A" * 40)
    assert done.returncode == 1 and "refused" in done.stderr


def test_nothing_pinned_refuses(keys, tmp_path):
    done = check(tmp_path, keys[1]["ed.asc"])
    assert done.returncode == 1 and "none is set" in done.stderr
