"""The real vLLM and SGLang parsers, in an environment of their own (requirements.txt here; check.py runs in it),
and TokenSpeed's `serve` parsers in another (tokenspeed_requirements.txt; tokenspeed_check.py runs in it: its
pins, transformers 5.12.0 and torch, disagree with vLLM's and SGLang's).

    python -m lab.engine_parsers build    # make engine-parsers: builds it once per requirements.txt
    python -m lab.engine_parsers python   # prints its interpreter
    python -m lab.engine_parsers tokenspeed-python   # prints the TokenSpeed parsers' interpreter
    python -m lab.engine_parsers llama-flags FLAGS_JSON   # the double's llama.cpp flags from the lab's real
                                                          # llama-server (llama_server.py; needs docker)

It is several GB (a CUDA build of torch: see requirements.txt), so it lives in a cache outside the checkout,
named by the requirements' hash, and is built again only when they change; an older one is removed then.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements.txt"
CHECK = HERE / "check.py"
PREFIX = "engine-parsers-"
# TokenSpeed's parsers (tokenspeed_check.py): the same building, under a prefix of their own.
TOKENSPEED = (HERE / "tokenspeed_requirements.txt", HERE / "tokenspeed_check.py", "tokenspeed-parser-")


def cache_root() -> Path:
    return Path(os.environ.get("MODELFLEET_CACHE") or Path.home() / ".cache" / "modelfleet")


def venv_dir(requirements: Path = REQUIREMENTS, prefix: str = PREFIX) -> Path:
    return cache_root() / (prefix + hashlib.sha256(requirements.read_bytes()).hexdigest()[:12])


def python(requirements: Path = REQUIREMENTS, prefix: str = PREFIX) -> Path:
    return venv_dir(requirements, prefix) / "bin" / "python"


def built(requirements: Path = REQUIREMENTS, prefix: str = PREFIX) -> bool:
    return (venv_dir(requirements, prefix) / ".built").exists()


def build(system_python: str, requirements: Path = REQUIREMENTS, check: Path = CHECK, prefix: str = PREFIX) -> Path:
    """Builds the environment unless it is there (idempotent); a half-built one from an interrupted run is
    started again, never used."""
    target = venv_dir(requirements, prefix)
    if built(requirements, prefix):
        return target
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    print(f"engine-parsers: installing {requirements.relative_to(HERE.parent.parent)} into {target} "
          "(a few GB, a few minutes; once per requirements change)", file=sys.stderr, flush=True)
    subprocess.run([system_python, "-m", "venv", str(partial)], check=True)
    subprocess.run([str(partial / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "-r",
                    str(requirements)], check=True, stdout=sys.stderr)
    # The parsers must import here: a package missing from requirements.txt fails the build, not a test later.
    subprocess.run([str(partial / "bin" / "python"), str(check), "argvs"], input=b"[]", check=True,
                   stdout=subprocess.DEVNULL)
    (partial / ".built").touch()
    for old in target.parent.glob(prefix + "*"):
        if old != partial:
            print(f"engine-parsers: removing the environment of older requirements, {old}", file=sys.stderr)
            shutil.rmtree(old, ignore_errors=True)
    # venv writes its own path into scripts and pyvenv.cfg; check.py runs with `bin/python` only, which
    # finds its site-packages relative to itself, so the folder may be renamed.
    partial.rename(target)
    return target


def main() -> None:
    command = sys.argv[1:2]
    if command == ["build"]:
        build(os.environ.get("SYSTEM_PYTHON", "python3"))
        requirements, check, prefix = TOKENSPEED
        build(os.environ.get("SYSTEM_PYTHON", "python3"), requirements, check, prefix)
    elif command == ["python"]:
        print(python())
    elif command == ["tokenspeed-python"]:
        print(python(TOKENSPEED[0], TOKENSPEED[2]))
    elif command == ["llama-flags"] and len(sys.argv) == 3:
        import lab
        from lab.engine_parsers import llama_server

        subprocess.run([str(lab.LAB_DIR / "build-llama-server.sh"), lab.llama_server_image()], check=True,
                       stdout=sys.stderr)
        llama_server.write_flags(lab.llama_server_image(), sys.argv[2])
    else:
        sys.exit(__doc__)
