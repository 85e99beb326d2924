"""The lab's signed apt repositories: stub .debs named like the real ones (NVIDIA's CUDA and Container Toolkit
repositories, Docker's, the distribution's), built with dpkg-deb, indexed with apt-ftparchive and signed with a
key made at `lab up`, served over HTTP on loopback under the real hosts' names (lab/apt/packages.yaml)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from lab import daemons

LISTEN = f"127.0.0.1:{5080 + daemons.NET}"
BASE = f"http://{LISTEN}"
KEY_UID = "modelfleet lab archive <lab-archive@modelfleet.invalid>"
CUDA_PATH = "developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64"
DISTRIBUTION = "debian"  # the repository standing in for the distribution's archive (signed by the lab's key)
# A bare lab host's only distribution source (its image has none: tests talk to loopback only).
DISTRO_LIST = f"deb [signed-by=/usr/share/keyrings/modelfleet-lab-archive.gpg] {BASE}/debian bookworm main\n"


def spec(lab_dir: Path) -> dict:
    return yaml.safe_load((lab_dir / "apt" / "packages.yaml").read_text())


def url(lab_dir: Path | None = None) -> str:
    """The CUDA repository's URL in the lab."""
    return f"{BASE}/{CUDA_PATH}/"


def stack_urls() -> dict:
    """Host data that points the GPU stack stages at the lab's repositories instead of the real hosts."""
    return {"nvidia_repo_url": f"{BASE}/developer.download.nvidia.com/compute/cuda/repos",
            "container_toolkit_repo_url": f"{BASE}/nvidia.github.io/libnvidia-container/stable/deb",
            "container_toolkit_key_url": f"{BASE}/nvidia.github.io/libnvidia-container/gpgkey",
            "docker_repo_url": f"{BASE}/download.docker.com/linux", "amd_repo_url": f"{BASE}/repo.radeon.com"}


def _gpg(home: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["gpg", "--homedir", str(home), "--batch", "--yes", "--quiet", *args], check=True,
                          capture_output=True, **kwargs)


def _signing_key(state: Path, home: Path | None = None) -> Path:
    """The archive key, made on first `lab up` (in `home`: another signer's, made on first use, for a test that
    swaps the key); returns the public keyring (binary, for signed-by)."""
    mine = home is None
    home = home or state / "gnupg"
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    keyring = state / "apt-archive-keyring.gpg" if mine else home / "archive-keyring.gpg"
    if subprocess.run(["gpg", "--homedir", str(home), "--batch", "--list-secret-keys", KEY_UID],
                      capture_output=True).returncode:
        _gpg(home, "--passphrase", "", "--quick-gen-key", KEY_UID, "ed25519", "sign", "never")
    keyring.write_bytes(_gpg(home, "--export", KEY_UID).stdout)
    return keyring


def fingerprint(home: Path) -> str:
    """The archive key's fingerprint, as gpg prints it: what the lab inventory pins for every repository."""
    listing = _gpg(home, "--with-colons", "--list-keys", KEY_UID, text=True).stdout
    return next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))


def _fill(text: str, values: dict) -> str:
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text


def _build_deb(package: dict, version: str, keyring: Path, values: dict, lab_dir: Path, out: Path) -> None:
    upstream = version.split(":", 1)[-1].rsplit("-", 1)[0]
    values = {**values, "version": version, "upstream": upstream}
    name = _fill(package["name"], values)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        (root / "DEBIAN").mkdir(parents=True)
        files = {**package.get("files", {}), f"/usr/share/doc/{name}/LAB-STUB":
                 "modelfleet lab stand-in: no real binaries inside.\n"}
        for dest, content in files.items():
            path = root / dest.lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            if content == "@keyring":
                shutil.copyfile(keyring, path)
                continue
            if content.startswith("@file:"):
                content = (lab_dir / content[len("@file:"):]).read_text()
            path.write_text(_fill(content, values))
            path.chmod(0o755 if content.startswith("#!") else 0o644)
        if package.get("postinst"):
            (root / "DEBIAN" / "postinst").write_text(package["postinst"])
            (root / "DEBIAN" / "postinst").chmod(0o755)
        control = {"Package": name, "Version": version, "Architecture": package["architecture"],
                   "Maintainer": "modelfleet lab <lab@modelfleet.invalid>", "Description": package["description"]}
        if package.get("depends"):
            control["Depends"] = ", ".join(package["depends"])
        (root / "DEBIAN" / "control").write_text("".join(f"{k}: {v}\n" for k, v in control.items()))
        filename = f"{name}_{version.split(':', 1)[-1]}_{package['architecture']}.deb"
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out / filename)],
                       check=True, capture_output=True)


def _sign(home: Path, release: Path) -> None:
    _gpg(home, "--local-user", KEY_UID, "--clearsign", "-o", str(release.parent / "InRelease"), str(release))
    _gpg(home, "--local-user", KEY_UID, "-abs", "-o", str(release.parent / "Release.gpg"), str(release))


def _index(repo: dict, root: Path, home: Path) -> None:
    """Packages + signed Release: flat (`deb URL /`) or dists (`deb URL suite component`); plain: none
    (a .deb published for download, like amdgpu-install)."""
    if repo["layout"] == "plain":
        return
    if repo["layout"] == "flat":
        packages = subprocess.run(["apt-ftparchive", "packages", "."], cwd=root, check=True, capture_output=True,
                                  text=True).stdout
        (root / "Packages").write_text(packages)
        subprocess.run(["gzip", "-9kf", "Packages"], cwd=root, check=True)
        target, options = root, []
    else:
        suite, component = repo["suite"], repo["component"]
        binary = root / "dists" / suite / component / "binary-amd64"
        binary.mkdir(parents=True)
        packages = subprocess.run(["apt-ftparchive", "packages", "pool"], cwd=root, check=True,
                                  capture_output=True, text=True).stdout
        (binary / "Packages").write_text(packages)
        subprocess.run(["gzip", "-9kf", "Packages"], cwd=binary, check=True)
        target = root / "dists" / suite
        options = [f"APT::FTPArchive::Release::{k}={v}" for k, v in
                   (("Suite", suite), ("Codename", suite), ("Components", component), ("Architectures", "amd64"))]
    release = subprocess.run(["apt-ftparchive", "-o", "APT::FTPArchive::Release::Origin=modelfleet-lab",
                              "-o", "APT::FTPArchive::Release::Label=modelfleet lab stand-in",
                              *[x for o in options for x in ("-o", o)], "release", "."], cwd=target, check=True,
                             capture_output=True, text=True).stdout
    (target / "Release").write_text(release)
    _sign(home, target / "Release")


def build(state: Path, lab_dir: Path, newer: dict[str, list[str]] | None = None, signer: Path | None = None) -> Path:
    """Build (or rebuild) every repository under state/apt; returns the public keyring. `newer`: more
    versions of some packages, as when upstream publishes a release (a rebuild without it withdraws them).
    `signer`: a GnuPG home whose own key signs the vendors' repositories and is served as their keys (and in
    their keyring packages), as vendor mirrors taken over would; the distribution's archive stays the lab's."""
    keyring = _signing_key(state, signer)
    own = state / "gnupg"
    if signer:
        _signing_key(state)
    data = spec(lab_dir)
    served = state / "apt"
    shutil.rmtree(served, ignore_errors=True)
    values = {"kernel": os.uname().release}
    for repo in data["repositories"]:
        root = served / repo["path"]
        pool = root if repo["layout"] in ("flat", "plain") else root / "pool" / repo["component"]
        pool.mkdir(parents=True)
        distribution = repo["path"] == DISTRIBUTION
        for package in repo["packages"]:
            for version in package["versions"] + (newer or {}).get(package["name"], []):
                _build_deb(package, _fill(version, values), state / "apt-archive-keyring.gpg" if distribution else
                           keyring, {**values, "url": f"{BASE}/{repo['path']}/", "base": BASE}, lab_dir, pool)
        _index(repo, root, own if distribution else signer or own)
    for path, kind in data.get("keys", {}).items():
        (served / path).parent.mkdir(parents=True, exist_ok=True)
        (served / path).write_bytes(_gpg(signer or own, "--armor", "--export", KEY_UID).stdout if kind == "armored"
                                    else keyring.read_bytes())
    # gpg leaves an agent running for its home; `lab down` must leave no process behind.
    for home in {own, signer or own}:
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], check=False, capture_output=True)
    return keyring


def serve(state: Path) -> None:
    host, port = LISTEN.rsplit(":", 1)
    daemons.start(state, "apt", [sys.executable, "-m", "http.server", "--bind", host, "--directory",
                                 str(state / "apt"), port], LISTEN, env={"PYTHONUNBUFFERED": "1"})


def ensure(state: Path, lab_dir: Path) -> dict:
    keyring = build(state, lab_dir)
    serve(state)
    # The lab's repositories are signed with its own key: the bare hosts pin it for each, as a site mirror
    # that signs with its own key would.
    pins = dict.fromkeys(("cuda", "docker", "nvidia-container-toolkit", "rocm"), [fingerprint(state / "gnupg")])
    return {"url": url(), "keyring": str(keyring), "stack_urls": {**stack_urls(), "repo_key_fingerprints": pins}}
