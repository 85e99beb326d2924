"""Resolve an image tag to its manifest digest on the control node (Docker Registry HTTP API v2).

The digest is pinned once per run here and every host pulls and runs `repo@sha256:...`, so hosts of a pool
can never run different builds of a moving tag.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from functools import lru_cache

DOCKER_HUB = "registry-1.docker.io"
ACCEPT = ", ".join([
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
])


class RegistryError(Exception):
    pass


def split_reference(image: str) -> tuple[str, str, str]:
    """'vllm/vllm-openai:v1' -> ('registry-1.docker.io', 'vllm/vllm-openai', 'v1')."""
    ref = image.partition("@")[0]
    name, tag = ref, "latest"
    if ":" in ref.rsplit("/", 1)[-1]:
        name, _, tag = ref.rpartition(":")
    first = name.split("/", 1)[0]
    if "/" in name and ("." in first or ":" in first or first == "localhost"):
        registry, repo = name.split("/", 1)
    else:
        registry, repo = DOCKER_HUB, name if "/" in name else f"library/{name}"
    return registry, repo, tag


def _scheme(registry: str) -> str:
    host = registry.split(":")[0]
    return "http" if host in ("localhost", "127.0.0.1") or host.startswith("127.") else "https"


def _bearer_token(challenge: str, repo: str) -> str:
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    query = urllib.parse.urlencode({"service": params.get("service", ""), "scope": f"repository:{repo}:pull"})
    with urllib.request.urlopen(f"{params['realm']}?{query}", timeout=30) as resp:
        body = json.load(resp)
    return body.get("token") or body.get("access_token", "")


@lru_cache(maxsize=None)
def resolve_digest(image: str) -> str:
    if "@sha256:" in image:
        return image.split("@", 1)[1]
    registry, repo, tag = split_reference(image)
    url = f"{_scheme(registry)}://{registry}/v2/{repo}/manifests/{tag}"
    headers = {"Accept": ACCEPT}
    for _attempt in range(2):
        req = urllib.request.Request(url, method="HEAD", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                digest = resp.headers.get("Docker-Content-Digest")
                if not digest:
                    raise RegistryError(f"{image}: registry sent no Docker-Content-Digest")
                return digest
        except urllib.error.HTTPError as exc:
            challenge = exc.headers.get("WWW-Authenticate", "")
            if exc.code == 401 and challenge.startswith("Bearer") and "Authorization" not in headers:
                headers["Authorization"] = f"Bearer {_bearer_token(challenge, repo)}"
                continue
            raise RegistryError(f"{image}: {url} answered HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise RegistryError(f"{image}: cannot reach {registry}: {exc}") from exc
    raise RegistryError(f"{image}: registry refused the anonymous token")


def pinned(image: str) -> str:
    """The image reference with its digest: 'repo:tag@sha256:...'."""
    if "@sha256:" in image:
        return image
    return f"{image}@{resolve_digest(image)}"
