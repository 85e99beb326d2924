"""The lab's signed apt repository: stub .debs named like NVIDIA's, built with dpkg-deb, indexed with
apt-ftparchive and signed with a key made at `lab up`, served over HTTP on loopback (a flat repository,
like NVIDIA's CUDA repository, so `deb [signed-by=...] URL /` lines work unchanged)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from modelfleet.lab import daemons

LISTEN = "127.0.0.1:5080"
KEY_UID = "modelfleet lab archive <lab-archive@modelfleet.invalid>"


def spec(lab_dir: Path) -> dict:
    return yaml.safe_load((lab_dir / "apt" / "packages.yaml").read_text())


def url(lab_dir: Path) -> str:
    return f"http://{LISTEN}/{spec(lab_dir)['repo_path']}/"


def _gpg(home: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["gpg", "--homedir", str(home), "--batch", "--yes", "--quiet", *args], check=True,
                          capture_output=True, **kwargs)


def _signing_key(state: Path) -> Path:
    """The archive key, made on first `lab up`; returns the public keyring (binary, for signed-by)."""
    home = state / "gnupg"
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    keyring = state / "apt-archive-keyring.gpg"
    if subprocess.run(["gpg", "--homedir", str(home), "--batch", "--list-secret-keys", KEY_UID],
                      capture_output=True).returncode:
        _gpg(home, "--passphrase", "", "--quick-gen-key", KEY_UID, "ed25519", "sign", "never")
    keyring.write_bytes(_gpg(home, "--export", KEY_UID).stdout)
    return keyring


def _build_deb(package: dict, keyring: Path, repo_url: str, out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        (root / "DEBIAN").mkdir(parents=True)
        files = {**package.get("files", {}), f"/usr/share/doc/{package['name']}/LAB-STUB":
                 "modelfleet lab stand-in: no real binaries inside.\n"}
        for dest, content in files.items():
            path = root / dest.lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            if content == "@keyring":
                shutil.copyfile(keyring, path)
            else:
                path.write_text(content.replace("{url}", repo_url))
        control = {"Package": package["name"], "Version": package["version"],
                   "Architecture": package["architecture"], "Maintainer": "modelfleet lab <lab@modelfleet.invalid>",
                   "Description": package["description"]}
        if package.get("depends"):
            control["Depends"] = ", ".join(package["depends"])
        (root / "DEBIAN" / "control").write_text("".join(f"{k}: {v}\n" for k, v in control.items()))
        name = f"{package['name']}_{package['version']}_{package['architecture']}.deb"
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out / name)],
                       check=True, capture_output=True)


def build(state: Path, lab_dir: Path) -> Path:
    """Build (or rebuild) the repository under state/apt; returns the public keyring."""
    keyring = _signing_key(state)
    data = spec(lab_dir)
    repo = state / "apt" / data["repo_path"]
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    for package in data["packages"]:
        _build_deb(package, keyring, url(lab_dir), repo)
    packages = subprocess.run(["apt-ftparchive", "packages", "."], cwd=repo, check=True, capture_output=True,
                              text=True).stdout
    (repo / "Packages").write_text(packages)
    subprocess.run(["gzip", "-9kf", "Packages"], cwd=repo, check=True)
    release = subprocess.run(["apt-ftparchive", "-o", "APT::FTPArchive::Release::Origin=modelfleet-lab",
                              "-o", "APT::FTPArchive::Release::Label=modelfleet lab CUDA stand-in",
                              "release", "."], cwd=repo, check=True, capture_output=True, text=True).stdout
    (repo / "Release").write_text(release)
    home = state / "gnupg"
    _gpg(home, "--local-user", KEY_UID, "--clearsign", "-o", str(repo / "InRelease"), str(repo / "Release"))
    _gpg(home, "--local-user", KEY_UID, "-abs", "-o", str(repo / "Release.gpg"), str(repo / "Release"))
    # gpg leaves an agent running for its home; `lab down` must leave no process behind.
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], check=False, capture_output=True)
    return keyring


def serve(state: Path) -> None:
    host, port = LISTEN.rsplit(":", 1)
    daemons.start(state, "apt", [sys.executable, "-m", "http.server", "--bind", host, "--directory",
                                 str(state / "apt"), port], LISTEN, env={"PYTHONUNBUFFERED": "1"})


def ensure(state: Path, lab_dir: Path) -> dict:
    keyring = build(state, lab_dir)
    serve(state)
    return {"url": url(lab_dir), "keyring": str(keyring)}

