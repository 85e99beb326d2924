"""Engine facts: the local image behind a reference, and a unit's state."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase


class DockerImage(FactBase):
    """Id and repo digests of a local image (None when absent)."""

    requires_command = "docker"

    def command(self, image: str) -> str:
        ref = shlex.quote(image)
        return f"docker image inspect --format '{{{{.Id}}}} {{{{json .RepoDigests}}}}' {ref} 2>/dev/null || true"

    def process(self, output):
        import json

        for line in output:
            image_id, _, digests = line.partition(" ")
            if image_id.startswith("sha256:"):
                return {"id": image_id, "repo_digests": json.loads(digests or "[]")}
        return None
