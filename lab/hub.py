"""The lab's Hugging Face hub double (lab/hub_double), on loopback: what HF_ENDPOINT points at in the lab.

It serves generated checkpoints, gated: every request needs the token made at `lab up` (.lab/hf-token, 0600),
so the model stage's token handling is exercised for real.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

from lab import daemons, scenario

LISTEN = f"127.0.0.1:{5070 + daemons.NET}"
ENDPOINT = f"http://{LISTEN}"
# repo=revisions:shards:MiB per shard. Two revisions, so upgrades and pinning have something to tell apart;
# `bench-64m` (8 x 8 MiB) gives `make bench-fanout` enough bytes to time.
REPOS = ("modelfleet/tiny-lab=main,v1.0:4:{mib}", "modelfleet/tiny-lab=bench-64m:8:8")
# Revision `moe` holds the tiny mixture-of-experts GGUF alone (lab/tiny_gguf.py with experts: 8 per layer, 2 per
# token, ~3.3 MiB), for the recipe that keeps its experts in host RAM (tiny-lab-llamacpp-moe,
# the scenario's moe, lab/scenario.py). The double serves every folder under its data's files/ as a commit.
MOE_REVISION, MOE_FILE, MOE_EXPERTS, MOE_EXPERT_FFN = "moe", "tiny-lab-moe.gguf", 8, 256
# The tiny Llama checkpoint the real vLLM serves (lab/tiny_llama.py, made inside the vLLM image), one commit.
LLAMA_REPO, LLAMA_REVISION = "modelfleet/tiny-llama", "main"


def token_file(state: Path) -> Path:
    path = state / "hf-token"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("hf_lab" + secrets.token_hex(16) + "\n")
    return path


def tiny_llama(state: Path, lab_dir: Path, vllm_image: str) -> Path:
    """The tiny Llama checkpoint in the hub's data as LLAMA_REPO at LLAMA_REVISION, made once by
    lab/tiny_llama.py with the vLLM image's torch and tokenizers (offline, as this user)."""
    revision = state / "hub" / "files" / LLAMA_REPO / LLAMA_REVISION
    if not (revision / "config.json").exists():
        work = state / "tiny-llama.partial"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        subprocess.run(["docker", "run", "--rm", "--network", "none", "--user", f"{os.getuid()}:{os.getgid()}",
                        "--entrypoint", "/opt/vllm/bin/python", "-v", f"{lab_dir}:/src/lab:ro", "-v", f"{work}:/out",
                        vllm_image, "/src/lab/tiny_llama.py", "/out"], check=True, capture_output=True)
        revision.parent.mkdir(parents=True, exist_ok=True)
        work.rename(revision)
    return revision


def ensure(state: Path, lab_dir: Path, vllm_image: str | None = None) -> dict:
    """Start the hub double (vllm_image: make the tiny Llama checkpoint with it first, when it is not there)."""
    mib = scenario.load(state / "scenario.json").hub_shard_mib
    argv = [sys.executable, str(lab_dir / "hub_double" / "hub_double.py"), "--data", str(state / "hub"),
            "--listen", LISTEN, "--token-file", str(token_file(state)), "--scenario", str(state / "scenario.json")]
    for repo in REPOS:
        argv += ["--repo", repo.format(mib=mib)]
    gguf = state / "tiny-lab.gguf"  # what the real llama-server loads (lab/tiny_gguf.py)
    if not gguf.exists():
        from lab import tiny_gguf  # numpy and gguf load only when the file is made

        tiny_gguf.write(gguf)
    argv += ["--extra-file", f"tiny-lab.gguf={gguf}"]
    moe = state / MOE_FILE
    if not moe.exists():
        from lab import tiny_gguf

        tiny_gguf.write(moe, experts=MOE_EXPERTS, expert_ffn=MOE_EXPERT_FFN)
    revision = state / "hub" / "files" / "modelfleet" / "tiny-lab" / MOE_REVISION
    if not (revision / MOE_FILE).exists():
        revision.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(moe, revision / MOE_FILE)
    if vllm_image:
        made = not (state / "hub" / "files" / LLAMA_REPO / LLAMA_REVISION / "config.json").exists()
        tiny_llama(state, lab_dir, vllm_image)
        if made:  # the hub double reads its commits when it starts: one started before knows nothing of it
            daemons.stop(state, "hub")
    daemons.start(state, "hub", argv, LISTEN)
    return {"endpoint": ENDPOINT, "token_file": str(token_file(state))}


def stats() -> dict:
    with urllib.request.urlopen(f"{ENDPOINT}/_lab/stats", timeout=5) as response:
        return json.load(response)


def reset_stats() -> None:
    urllib.request.urlopen(urllib.request.Request(f"{ENDPOINT}/_lab/reset", method="POST"), timeout=5).read()


def freeze(after_bytes: int) -> None:
    """The frozen-hub fault: every file body stops after `after_bytes` and stays open; reset_stats() ends it."""
    urllib.request.urlopen(urllib.request.Request(f"{ENDPOINT}/_lab/freeze?after={after_bytes}", method="POST"),
                           timeout=5).read()
