"""What a stage has already put on a host, read in one round trip: paths (kind, mode, owner, sha256), units
and local images."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

MARK = "@@modelfleet-state"


class DeployedState(FactBase):
    """
    {"paths": {path: None | {"kind": "dir"|"file", "mode": "600", "user", "group", "sha256"}},
     "units": {unit: {"ActiveState": ..., "UnitFileState": ...}}, "images": {ref: None | {"id": "sha256:..."}}}.
    A stage fetches it once and decides every file, directory, unit and image from it, instead of one
    stat/sha/systemctl/docker round trip per operation.
    """

    @staticmethod
    def default():
        return {"paths": {}, "units": {}, "images": {}}

    def command(self, paths: tuple[str, ...] = (), units: tuple[str, ...] = (), images: tuple[str, ...] = ()) -> str:
        quoted_paths = " ".join(shlex.quote(p) for p in paths)
        quoted_units = " ".join(shlex.quote(u) for u in units)
        quoted_images = " ".join(shlex.quote(i) for i in images)
        return (
            f"for p in {quoted_paths}; do echo \"{MARK} path $p\"; "
            'if [ -d "$p" ]; then stat -c "dir %a %U %G -" -- "$p"; '
            'elif [ -f "$p" ]; then echo "file $(stat -c "%a %U %G" -- "$p") $(sha256sum < "$p" | cut -c1-64)"; '
            "fi; done; "
            f"for u in {quoted_units}; do echo \"{MARK} unit $u\"; "
            'systemctl show -p ActiveState -p UnitFileState -- "$u" 2>/dev/null; done; '
            f"for i in {quoted_images}; do echo \"{MARK} image $i\"; "
            'docker image inspect --format "id={{.Id}}" -- "$i" 2>/dev/null; done; true'
        )

    def process(self, output):
        result = self.default()
        kind, name = None, None
        for line in output:
            if line.startswith(MARK):
                kind, _, name = line[len(MARK):].strip().partition(" ")
                result[f"{kind}s"][name] = {} if kind == "unit" else None
            elif kind == "path" and line.split()[:1] in (["dir"], ["file"]):
                what, mode, user, group, digest = line.split()
                result["paths"][name] = {"kind": what, "mode": mode.zfill(3), "user": user, "group": group,
                                         "sha256": None if digest == "-" else digest}
            elif kind == "image" and line.startswith("id=sha256:"):
                result["images"][name] = {"id": line[3:]}
            elif kind == "unit" and "=" in line:
                key, _, value = line.partition("=")
                result["units"][name][key] = value
        return result
