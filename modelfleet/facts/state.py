"""What a stage has already put on a host, read in one round trip: paths (kind, mode, owner, sha256), units
local images, checkpoint trees (files with size and mtime, the manifest, free space) and Debian packages."""

from __future__ import annotations

import json
import re
import shlex

from pyinfra.api import FactBase

from modelfleet.host_commands import parse_unit_show, unit_show_command

MARK = "@@modelfleet-state"
# What systemd makes of a unit: its state, where its file and drop-ins are, and the effective command and restart
# policy (a drop-in or a unit file elsewhere can change them while the file modelfleet wrote stays the same).
UNIT_PROPERTIES = ("ActiveState", "UnitFileState", "LoadState", "FragmentPath", "DropInPaths", "NeedDaemonReload",
                   "ExecStart", "Restart")


class DeployedState(FactBase):
    """
    {"paths": {path: None | {"kind": "dir"|"file", "mode": "600", "user", "group", "sha256",
                             "entries": a directory's first 64 names (LC_ALL=C order)}},
     "units": {unit: {"ActiveState", "UnitFileState", "LoadState", "FragmentPath", "NeedDaemonReload",
                      "Restart": ...,
                      "ExecStart": [argv, ...] (systemd's effective command lines),
                      "DropInPaths": [path, ...], "dropins": {path: content}}} (what systemd merges into the unit),
     "images": {ref: None | {"id": "sha256:..."}},
     "trees": {dir: {"files": {relpath: [size, mtime]}, "manifest": dict | None, "free_bytes": int | None,
                     "current": target of the sibling `current` link, "revisions": sibling commit dirs, newest first,
                     "partials": {relpath: size} (a fetch's partial files), "busy": sibling revisions a live fetch
                     holds, "unfinished": the others without a manifest}},
     "packages": {name: None | {"version": "580.159.04-1", "held": bool}},
     "texts": {path: None | content} (small config files a stage must read, e.g. /etc/docker/daemon.json)}.
    A stage fetches it once and decides every file, directory, unit and image from it, instead of one
    stat/sha/systemctl/docker round trip per operation.
    """

    @staticmethod
    def default():
        return {"paths": {}, "units": {}, "images": {}, "trees": {}, "packages": {}, "texts": {}}

    def command(self, paths: tuple[str, ...] = (), units: tuple[str, ...] = (), images: tuple[str, ...] = (),
                trees: tuple[str, ...] = (), packages: tuple[str, ...] = (), texts: tuple[str, ...] = ()) -> str:
        quoted_paths = " ".join(shlex.quote(p) for p in paths)
        quoted_units = " ".join(shlex.quote(u) for u in units)
        quoted_images = " ".join(shlex.quote(i) for i in images)
        quoted_trees = " ".join(shlex.quote(t) for t in trees)
        quoted_packages = " ".join(shlex.quote(k) for k in packages)
        # Installed packages only ("ii"); a hold shows as "hi".
        package_part = (
            f"for k in {quoted_packages}; do echo \"{MARK} package $k\"; "
            "dpkg-query -W -f='${db:Status-Abbrev} ${Version}\\n' -- \"$k\" 2>/dev/null | grep -E '^[hi]i '; "
            "done; ") if packages else ""
        unit_show = unit_show_command('"$u"', UNIT_PROPERTIES)
        text_part = "".join(f"echo \"{MARK} text {shlex.quote(t)}\"; [ -f {shlex.quote(t)} ] && sed 's/^/= /' "
                            f"{shlex.quote(t)}; " for t in texts)
        return (
            f"for p in {quoted_paths}; do echo \"{MARK} path $p\"; "
            'if [ -d "$p" ]; then stat -c "dir %a %U %G -" -- "$p"; '
            # A directory's first entries by name: whether modelfleet may take it over (operations.files).
            'echo entries; LC_ALL=C ls -A -- "$p" | head -n 64 | sed "s/^/entry /"; '
            'elif [ -f "$p" ]; then echo "file $(stat -c "%a %U %G" -- "$p") $(sha256sum < "$p" | cut -c1-64)"; '
            "fi; done; "
            f"for u in {quoted_units}; do echo \"{MARK} unit $u\"; "
            f"s=$({unit_show} 2>/dev/null); echo \"$s\"; "
            # Each drop-in's text, so a stage can tell what it changes (one systemctl call per unit).
            'for d in $(echo "$s" | sed -n "s/^DropInPaths=//p"); do echo "' + MARK + ' dropin $u $d"; '
            '[ -f "$d" ] && sed "s/^/= /" -- "$d"; done; done; '
            f"for i in {quoted_images}; do echo \"{MARK} image $i\"; "
            'docker image inspect --format "id={{.Id}}" -- "$i" 2>/dev/null; done; '
            f"for t in {quoted_trees}; do echo \"{MARK} tree $t\"; "
            'p="$t"; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; '
            'echo "free $(df -B1 -P "$p" | awk \'NR==2 {print $4}\')"; '
            '[ -f "$t/.modelfleet-manifest.json" ] && echo "manifest $(tr -d \'\\n\' < "$t/.modelfleet-manifest.json")"; '
            '[ -d "$t" ] && find "$t" -type f ! -path "*/.cache/*" \\( -name "*.modelfleet-partial" '
            '-printf "partial %s %P\\n" -o ! -name ".modelfleet-*" -printf "file %s %T@ %P\\n" \\); '
            'echo "current $(readlink "$(dirname "$t")/current")"; '
            'echo "revisions $(ls -t "$(dirname "$t")" 2>/dev/null | grep -Ex "[0-9a-f]{40}" | tr "\\n" " ")"; '
            # A fetch holds its destination's lock while it runs: partial files and unmanifested revision
            # directories without one are left over from a fetch that died (or a host that restarted).
            'for r in $(ls "$(dirname "$t")" 2>/dev/null | grep -Ex "[0-9a-f]{40}"); do d="$(dirname "$t")/$r"; '
            '[ -f "$d/.modelfleet-lock" ] && ! flock -n "$d/.modelfleet-lock" true 2>/dev/null && echo "busy $r" '
            '&& continue; [ -f "$d/.modelfleet-manifest.json" ] || echo "unfinished $r"; done; '
            "done; " + package_part + text_part + "true"
        )

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
                result[f"{kind}s"][name] = {"unit": {}, "tree": {"files": {}, "manifest": None, "free_bytes": None,
                                                                       "current": None, "revisions": []}
                                            }.get(kind)
            elif kind == "path" and line.split()[:1] in (["dir"], ["file"]):
                what, mode, user, group, digest = line.split()
                result["paths"][name] = {"kind": what, "mode": mode.zfill(3), "user": user, "group": group,
                                         "sha256": None if digest == "-" else digest}
            elif kind == "path" and result["paths"][name] and (line == "entries" or line.startswith("entry ")):
                entries = result["paths"][name].setdefault("entries", [])
                entries += [line[6:]] if line != "entries" else []
            elif kind == "tree":
                tree = result["trees"][name]
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
                elif word in ("busy", "unfinished"):
                    tree.setdefault(word, []).append(rest)
            elif kind == "text" and (line.startswith("= ") or line == "="):
                result["texts"][name] = (result["texts"][name] or "") + line[2:] + "\n"
            elif kind == "package" and line[:3] in ("ii ", "hi "):
                result["packages"][name] = {"version": line.split()[1], "held": line.startswith("h")}
            elif kind == "image" and line.startswith("id=sha256:"):
                result["images"][name] = {"id": line[3:]}
            elif kind == "dropin" and (line.startswith("= ") or line == "="):
                dropins[name] = (dropins[name] or "") + line[2:] + "\n"
            elif kind == "unit":
                result["units"][name].update(_unit_properties(parse_unit_show([line])))
        return result


def _unit_properties(props: dict[str, str]) -> dict:
    """DropInPaths as a list; ExecStart as the argv of each command line (`{ path=... ; argv[]=... ; ... }`)."""
    out = dict(props)
    if "DropInPaths" in out:
        out["DropInPaths"] = out["DropInPaths"].split()
    if "ExecStart" in out:
        out["ExecStart"] = re.findall(r"argv\[\]=(.*?) ; ", out["ExecStart"])
    return out
