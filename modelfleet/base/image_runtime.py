"""What an engine image is built with (CUDA or ROCm), as data its recipe states with its source, checked two
ways: against the image tag's own naming where the publisher encodes it, and against the host's driver branch
(a CUDA 13 image does not run on a driver that serves CUDA 12: `CUDA driver version is insufficient`)."""

from __future__ import annotations

import re

# The newest CUDA each data-center driver branch serves: NVIDIA CUDA Toolkit release notes, "CUDA Toolkit and
# Corresponding Driver Versions" (R580 ships with CUDA 13.0; `nvidia-smi --version` says the same, e.g. the
# recorded 580.159.04 host: CUDA Version 13.0, 590.44.01: 13.1).
DRIVER_CUDA = {"535": "12.2", "550": "12.4", "560": "12.6", "565": "12.7", "570": "12.8", "575": "12.9",
               "580": "13.0", "590": "13.1"}
LLAMA_CPP = "ghcr.io/ggml-org/llama.cpp"
VLLM = "vllm/vllm-openai"
NAMES = {"cuda": "CUDA", "rocm": "ROCm"}


def _major(version: str) -> int:
    return int(version.split(".")[0])


def tag_runtime(image: str) -> tuple[str, str, str] | None:
    """(cuda|rocm, version, why) as the tag itself says, None where it says nothing. A version of one number
    is a major version only."""
    name, _, tag = image.split("@", 1)[0].rpartition(":")
    if not name or "/" in tag:
        return None
    if m := re.search(r"(?:^|-)cu(\d{2})(\d)(?:$|-)", tag):  # vLLM's and SGLang's -cu129, -cu130
        return "cuda", f"{int(m.group(1))}.{m.group(2)}", f"the tag's -cu{m.group(1)}{m.group(2)} suffix"
    if m := re.search(r"rocm(\d)(\d)(\d)", tag):  # rocm720: ROCm 7.2.0
        return "rocm", ".".join(m.groups()), f"the tag's rocm{''.join(m.groups())}"
    if name.endswith(LLAMA_CPP) and (m := re.match(r"^(?:server|full|light)-cuda(\d*)(?:-|$)", tag)):
        # ggml-org publishes -cuda (CUDA 12) and -cuda13 (CUDA 13) builds of each image.
        return "cuda", m.group(1) or "12", f"llama.cpp's {tag} tag (-cuda: CUDA 12, -cuda13: CUDA 13)"
    if name.endswith(VLLM) and (m := re.match(r"^v(\d+)\.(\d+)", tag)) and (int(m[1]), int(m[2])) >= (0, 20):
        return "cuda", "13", "vLLM's unsuffixed tags from v0.20 on (CUDA 12 builds carry -cu129)"
    return None


def tag_problem(image: str, cuda: str | None, rocm: str | None) -> str | None:
    """Why the recipe's cuda/rocm disagrees with what its image tag says, or None."""
    said = tag_runtime(image)
    if not said:
        return None
    kind, version, why = said
    declared = cuda if kind == "cuda" else rocm
    other = rocm if kind == "cuda" else cuda
    if not declared and not other:  # nothing stated: nothing to contradict (render shows what the tag says)
        return None
    if other:
        return (f"image {image} is a {NAMES[kind]} {version} build ({why}): set `{kind}: \"{version}\"` "
                f"(not `{'rocm' if kind == 'cuda' else 'cuda'}`)")
    same = _major(declared) == _major(version) if "." not in version else \
        declared.split(".")[:2] == version.split(".")[:2]
    return None if same else (f"{kind}: {declared} but image {image} is a {NAMES[kind]} {version} build ({why}); "
                              f"name the image built with {NAMES[kind]} {declared}, or say {version}")


def driver_problem(cuda: str | None, driver_branch: str) -> str | None:
    """Why a CUDA `cuda` image will not run on driver branch `driver_branch`, or None (a newer minor release of
    the same major runs through CUDA's minor version compatibility)."""
    served = DRIVER_CUDA.get(driver_branch)
    if not cuda or not served or _major(cuda) <= _major(served):
        return None
    return (f"{driver_branch} serves CUDA {served}, the image is built with CUDA {cuda}: raise driver_branch "
            f"(R{next(b for b, v in DRIVER_CUDA.items() if _major(v) >= _major(cuda))} serves CUDA {_major(cuda)}) "
            "or take a recipe whose image is built for it")


def render_note(image: str, cuda: str | None, rocm: str | None, source: str | None, vendor: str,
                driver_branch: str) -> str:
    """What `render` says of the image's CUDA/ROCm: the recipe's word and its source, the tag's, the driver's."""
    kind, declared = ("cuda", cuda) if cuda else ("rocm", rocm) if rocm else (None, None)
    said = tag_runtime(image)
    parts = [f"image {image}: built with {NAMES[kind]} {declared} (recipe; source: {source or 'not given'})"
             if kind else "image {image}: the recipe names no CUDA/ROCm version".format(image=image)]
    if said:
        parts.append(f"the tag says {NAMES[said[0]]} {said[1]} ({said[2]}): "
                     + ("agrees" if kind and not tag_problem(image, cuda, rocm) else "not checked" if not kind
                        else "DISAGREES"))
    else:
        parts.append("the tag does not say")
    if vendor == "nvidia" and cuda:
        served = DRIVER_CUDA.get(driver_branch)
        parts.append(f"driver branch {driver_branch} serves CUDA {served}: "
                     + ("ok" if not driver_problem(cuda, driver_branch) else "too old") if served
                     else f"driver branch {driver_branch}: CUDA it serves not known here")
    return "; ".join(parts)
