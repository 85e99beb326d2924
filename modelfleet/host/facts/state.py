"""What a stage has already put on a host, read in one round trip: paths (kind, mode, owner, sha256), units
local images, checkpoint trees (files with size and mtime, the manifest, free space) and packages (as the host's
OS family's package database has them)."""

from __future__ import annotations

import json
import re

from pyinfra.api import FactBase

from modelfleet.base.host_commands import (
    CURRENT,
    FETCH_LOCK,
    MANIFEST,
    PARTIAL,
    parse_unit_show,
    program,
    unit_show_command,
)
from modelfleet.host import os as osfam

MARK = "@@modelfleet-state"
# The kinds of things the fact reads, each a key of its result and a keyword of its command (a stage's wants()
# declares what it reads by these kinds).
STATE_KINDS = ("paths", "units", "images", "trees", "packages", "texts", "owned", "users", "reboots")
# The first line of every unit file modelfleet writes (templates/*.service.j2): what marks a unit as its own, so
# one the inventory no longer names may be retired (modelfleet.run.retire), and one a user wrote never is.
OWNED_MARK = "# Managed by modelfleet - do not edit; re-run the deploy instead."
# What systemd makes of a unit: its state, where its file and drop-ins are, and the effective command and restart
# policy (a drop-in or a unit file elsewhere can change them while the file modelfleet wrote stays the same), and
# how often systemd restarted it on its own since it was last started (a pool's rank that died: units.rank_restarted).
UNIT_PROPERTIES = ("ActiveState", "UnitFileState", "LoadState", "FragmentPath", "DropInPaths", "NeedDaemonReload",
                   "ExecStart", "Restart", "NRestarts")


class DeployedState(FactBase):
    """
    {"paths": {path: None | {"kind": "dir"|"file", "mode": "600", "user", "group", "sha256",
                             "entries": a directory's first 64 names (LC_ALL=C order)}},
     "units": {unit: {"ActiveState", "UnitFileState", "LoadState", "FragmentPath", "NeedDaemonReload",
                      "Restart", "NRestarts": ...,
                      "ExecStart": [argv, ...] (systemd's effective command lines),
                      "DropInPaths": [path, ...], "dropins": {path: content}}} (what systemd merges into the unit),
     "images": {ref: None | {"id": "sha256:..."}},
     "trees": {dir: {"files": {relpath: [size, mtime]}, "manifest": dict | None, "free_bytes": int | None,
                     "current": target of the sibling `current` link, "revisions": sibling commit dirs, newest first,
                     "partials": {relpath: size} (a fetch's partial files), "busy": sibling revisions a live fetch
                     holds, "unfinished": the others without a manifest, "odd": "TYPE PATH" of what is
                     neither a directory nor a plain file (find's %y: l symlink, b/c device, ...) or is setuid}},
     "packages": {name: None | {"version": "580.159.04-1", "held": bool}},
     "texts": {path: None | content} (small config files a stage must read, e.g. /etc/docker/daemon.json),
     "owned": {unit_dir: {unit: {"text": its file, and UNIT_PROPERTIES as under "units"}}} (the unit files there
              that modelfleet wrote, by OWNED_MARK),
     "users": {name: None | uid} (system users a stage creates),
     "reboots": {"host": True | None} (whether the host needs a reboot, for an OS family that answers by a program:
                modelfleet.host.os's REBOOT_SH)}.
    A stage fetches it once and decides every file, directory, unit and image from it, instead of one
    stat/sha/systemctl/docker round trip per operation.
    """

    @staticmethod
    def default():
        return {kind: {} for kind in STATE_KINDS}

    def command(self, paths: tuple[str, ...] = (), units: tuple[str, ...] = (), images: tuple[str, ...] = (),
                trees: tuple[str, ...] = (), packages: tuple[str, ...] = (), texts: tuple[str, ...] = (),
                owned: tuple[str, ...] = (), users: tuple[str, ...] = (), reboots: tuple[str, ...] = (),
                family: str | None = None) -> str:
        """`family`: the host's OS family (modelfleet.host.os), which reads its packages (and, where it answers by a
        program, whether the host needs a reboot); the default one if None."""
        fam = osfam.by_name(family)
        kinds = {"path": paths, "unit": units, "image": images, "tree": trees, "package": packages, "text": texts,
                 "owned": owned, "user": users, "reboot": reboots}
        asks = {"reboot_needed": fam.REBOOT_SH} if fam.REBOOT_SH and reboots else {}
        return program("deployed_state", *(f"{kind}={value}" for kind, values in kinds.items() for value in values),
                       env={"MARK": MARK, "MANIFEST": MANIFEST, "FETCH_LOCK": FETCH_LOCK, "PARTIAL": PARTIAL,
                            "CURRENT": CURRENT, "OWNED_MARK": OWNED_MARK},
                       functions={"unit_show": unit_show_command('"$1"', UNIT_PROPERTIES),
                                  "package_state": fam.PACKAGE_STATE_SH, **asks})

    def process(self, output):
        result = self.default()
        kind, name = None, None
        for line in output:
            if line.startswith(f"{MARK} dropin "):
                unit, _, dropin = line[len(MARK) + 8:].partition(" ")
                kind, name = "dropin", dropin
                result["units"][unit].setdefault("dropins", {})[dropin] = None
                dropins = result["units"][unit]["dropins"]
            elif line.startswith(MARK):
                kind, _, name = line[len(MARK):].strip().partition(" ")
                result["owned" if kind == "owned" else f"{kind}s"][name] = {
                    "unit": {}, "owned": {},
                    "tree": {"files": {}, "manifest": None, "free_bytes": None, "current": None, "revisions": []},
                }.get(kind)
            elif kind == "path" and line.split()[:1] in (["dir"], ["file"]):
                what, mode, user, group, digest = line.split()
                result["paths"][name] = {"kind": what, "mode": mode.zfill(3), "user": user, "group": group,
                                         "sha256": None if digest == "-" else digest}
            elif kind == "path" and result["paths"][name] and (line == "entries" or line.startswith("entry ")):
                entries = result["paths"][name].setdefault("entries", [])
                entries += [line[6:]] if line != "entries" else []
            elif kind == "tree":
                _tree_line(result["trees"][name], line)
            elif kind == "text" and (line.startswith("= ") or line == "="):
                result["texts"][name] = (result["texts"][name] or "") + line[2:] + "\n"
            elif kind == "package" and line[:3] in ("ii ", "hi "):
                result["packages"][name] = {"version": line.split()[1], "held": line.startswith("h")}
            elif kind == "reboot" and line == "needed":
                result["reboots"][name] = True
            elif kind == "user" and line.isdigit():
                result["users"][name] = int(line)
            elif kind == "image" and line.startswith("id=sha256:"):
                result["images"][name] = {"id": line[3:]}
            elif kind == "dropin" and (line.startswith("= ") or line == "="):
                dropins[name] = (dropins[name] or "") + line[2:] + "\n"
            elif kind == "unit":
                result["units"][name].update(_unit_properties(parse_unit_show([line])))
            elif kind == "owned" and line.startswith("unit "):
                owned = result["owned"][name][line[5:]] = {"text": ""}
            elif kind == "owned" and result["owned"][name] and (line.startswith("= ") or line == "="):
                owned["text"] += line[2:] + "\n"
            elif kind == "owned" and result["owned"][name]:
                owned.update(_unit_properties(parse_unit_show([line])))
        return result


def _tree_line(tree: dict, line: str) -> None:
    """One line of a checkpoint tree's section into `tree` (the keys DeployedState's doc lists under "trees")."""
    word, _, rest = line.partition(" ")
    if word == "free" and rest.isdigit():
        tree["free_bytes"] = int(rest)
    elif word == "manifest":
        try:
            tree["manifest"] = json.loads(rest)
        except ValueError:
            tree["manifest"] = None
    elif word == "current":
        tree["current"] = rest or None
    elif word == "revisions":
        tree["revisions"] = rest.split()
    elif word == "file":
        size, mtime, rel = rest.split(" ", 2)
        tree["files"][rel] = [int(size), float(mtime)]
    elif word == "partial":
        size, rel = rest.split(" ", 1)
        tree.setdefault("partials", {})[rel] = int(size)
    elif word in ("busy", "unfinished", "odd"):
        tree.setdefault(word, []).append(rest)


def _unit_properties(props: dict[str, str]) -> dict:
    """DropInPaths as a list; ExecStart as the argv of each command line (`{ path=... ; argv[]=... ; ... }`)."""
    out = dict(props)
    if "DropInPaths" in out:
        out["DropInPaths"] = out["DropInPaths"].split()
    if "ExecStart" in out:
        out["ExecStart"] = re.findall(r"argv\[\]=(.*?) ; ", out["ExecStart"])
    return out
