"""An engine run from a virtual environment on the host (`runtime: venv`, docs/venv.md): the site's lock read on
the control node (every requirement pinned and hashed), the wheelhouse checked against it, the venv's path (engine,
version, lock digest), and the host-side build command. Pure: no SSH; the images stage runs the build."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from modelfleet.base import runscope

VENV_ROOT = "/opt/modelfleet/venvs"
WHEELHOUSE_ROOT = "/opt/modelfleet/wheelhouse"
COMPLETE = ".modelfleet-complete"  # written last: a venv without it is a build that did not finish
LOCK_COPY = "modelfleet-lock.txt"  # the lock the venv was built from, inside it
ENGINE_USER = "modelfleet-engine"  # the dedicated user every venv engine runs as (never root)
USER_LINE = "/etc/passwd"  # read (DeployedState texts) to know whether ENGINE_USER exists
KEEP = 1  # venvs kept per engine on a host beyond those in use: the previous one, for rollback
DIGEST_LENGTH = 12
_HASH = re.compile(r"--hash[= ]sha256:([0-9a-f]{64})\b")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class LockEntry:
    name: str  # canonical (PEP 503)
    version: str
    hashes: tuple[str, ...]
    line: int


@dataclass(frozen=True)
class Lock:
    path: str
    digest: str  # sha256 of the file: part of the venv's path, so another lock is another venv
    entries: tuple[LockEntry, ...]

    def get(self, name: str) -> LockEntry | None:
        return next((e for e in self.entries if e.name == canonicalize_name(name)), None)


@dataclass(frozen=True)
class VenvPlan:
    """Where a service's venv lives on its host and what it is built from (the control node's files)."""

    path: str  # /opt/modelfleet/venvs/<engine>-<version>-<lock digest>
    engine: str
    version: str
    lock_file: str
    lock_digest: str
    python: str  # the interpreter on the host that makes the venv (`python -m venv`), never the venv of another
    python_needs: tuple[str, ...] = ()  # X.Y the wheels are built for (from the wheelhouse); (): any
    python_min: str | None = None  # the recipe's oldest supported Python
    wheelhouse: str | None = None  # control-node directory whose files are pushed (air-gapped); None: the index
    wheels: tuple[str, ...] = ()  # the wheelhouse's files the lock names
    index_url: str | None = None  # the site's package index; None (and no wheelhouse): the host's pip settings
    entrypoint: tuple[str, ...] = ()  # the engine's command under bin/

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @property
    def staging(self) -> str:
        """Where the lock (and the wheelhouse's files) land on the host before the build: root's own tree."""
        return f"{WHEELHOUSE_ROOT}/{self.name}"

    @property
    def marker(self) -> str:
        return f"{self.path}/{COMPLETE}"

    @property
    def argv0(self) -> list[str]:
        head, *rest = self.entrypoint
        return [f"{self.path}/bin/{head}", *rest]


def _lines(text: str):
    """(first line number, logical line) with comments dropped and backslash continuations joined."""
    start, parts = None, []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0] if not raw.lstrip().startswith("#") else ""
        start = start or number
        if line.rstrip().endswith("\\"):
            parts.append(line.rstrip()[:-1])
            continue
        parts.append(line)
        joined = " ".join(p.strip() for p in parts).strip()
        if joined:
            yield start, joined
        start, parts = None, []


def parse_lock(path: str, text: str) -> tuple[Lock, list[str]]:
    """The lock and what is wrong with it: every entry pinned (`name==version`) with at least one sha256, and
    nothing but entries (modelfleet gives pip its index or wheelhouse; a lock that names one would override it)."""
    entries, problems = [], []
    for number, line in _lines(text):
        where = f"{path} line {number}"
        spec = line.split(" --", 1)[0].strip() if not line.startswith("-") else ""
        if not spec:
            problems.append(f"{where}: {line.split()[0]} is an option, not a requirement: a lock holds only "
                            "pinned requirements with hashes (give the index or wheelhouse as venv_index_url or "
                            "venv_wheelhouse)")
            continue
        try:
            req = Requirement(spec)
        except InvalidRequirement as exc:
            problems.append(f"{where}: not a requirement ({exc})")
            continue
        pins = [s for s in req.specifier if s.operator in ("==", "===") and "*" not in s.version]
        hashes = tuple(_HASH.findall(line))
        if req.url or len(pins) != 1 or len(req.specifier) != 1:
            problems.append(f"{where}: {req.name} is not pinned to one version (`{req.name}==X.Y.Z`)")
            continue
        if not hashes:
            problems.append(f"{where}: {req.name}=={pins[0].version} has no --hash=sha256:... (pip installs "
                            "with --require-hashes: make the lock with --generate-hashes)")
            continue
        entries.append(LockEntry(canonicalize_name(req.name), pins[0].version, hashes, number))
    if not entries and not problems:
        problems.append(f"{path}: no requirement in it")
    digest = hashlib.sha256(text.encode()).hexdigest()
    return Lock(path=path, digest=digest, entries=tuple(entries)), problems


def _read(path: str) -> tuple[Lock, tuple[str, ...]] | str:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot read {path} on the control node: {exc.strerror if isinstance(exc, OSError) else exc}"
    lock, problems = parse_lock(path, text)
    return lock, tuple(problems)


def read_lock(path: str) -> tuple[Lock | None, list[str]]:
    """The control node's lock file, read once per content (validate, render and the run all ask)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return None, [f"cannot read {path} on the control node: {exc.strerror}"]
    read = runscope.slot("venv locks", dict)  # once per run and file version: validate, render, stages
    key = (path, st.st_mtime_ns, st.st_size, st.st_ino)
    found = read[key] = read[key] if key in read else _read(path)
    if isinstance(found, str):
        return None, [found]
    return found[0], list(found[1])


def requirement_problems(lock: Lock, requires: list[str], prerelease: bool) -> list[str]:
    """What the guide's requirements (the recipe's `requires`) say that the lock does not hold."""
    problems = []
    for text in requires:
        req = Requirement(text)
        entry = lock.get(req.name)
        if entry is None:
            problems.append(f"the recipe needs {text} (the guide installs it); {lock.path} has no {req.name}")
        elif not req.specifier.contains(entry.version, prereleases=True if prerelease else None):
            problems.append(f"the recipe needs {text}; {lock.path} pins {req.name}=={entry.version}")
    return problems


def _wheel_pythons(filename: str) -> set[str] | None:
    """The Python versions (X.Y) a wheel runs on, where its tags pin one (cp311-cp311); None: any (py3, abi3)."""
    try:
        *_, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return None
    found = set()
    for tag in tags:
        m = re.fullmatch(r"cp(\d)(\d+)", tag.abi.rstrip("dmu")) if tag.abi not in ("none", "abi3") else None
        if m is None:
            return None
        found.add(f"{m.group(1)}.{m.group(2)}")
    return found


def _dist_of(filename: str) -> tuple[str, str] | None:
    """(canonical name, version) a wheel or sdist file holds."""
    try:
        if filename.endswith(".whl"):
            name, version, *_ = parse_wheel_filename(filename)
            return str(name), str(version)
        m = re.fullmatch(r"(.+)-([^-]+)\.(tar\.gz|zip)", filename)
        return (canonicalize_name(m.group(1)), str(Version(m.group(2)))) if m else None
    except (InvalidWheelFilename, InvalidVersion):
        return None


def wheelhouse_files(lock: Lock, directory: str) -> tuple[list[str], list[str], tuple[str, ...]]:
    """(the wheelhouse's files the lock names, what is missing, the Python X.Y its wheels need). The files'
    digests are checked on the host by pip (--require-hashes) before anything is installed."""
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        return [], [f"cannot list {directory} on the control node: {exc.strerror}"], ()
    by_dist: dict[tuple[str, str], list[str]] = {}
    for filename in names:
        dist = _dist_of(filename)
        if dist and os.path.isfile(os.path.join(directory, filename)):
            by_dist.setdefault(dist, []).append(filename)
    files, missing, pythons = [], [], None
    for entry in lock.entries:
        found = by_dist.get((entry.name, str(Version(entry.version))))
        if not found:
            missing.append(f"{directory} has no wheel or sdist of {entry.name}=={entry.version} "
                           f"({lock.path} line {entry.line})")
            continue
        files += found
        allowed = [_wheel_pythons(f) if f.endswith(".whl") else None for f in found]
        if None not in allowed:
            union = set().union(*allowed)
            pythons = union if pythons is None else pythons & union
    if pythons is not None and not pythons:
        missing.append(f"{directory}: its wheels are built for different Python versions; no one interpreter "
                       "runs them all")
    return files, missing, tuple(sorted(pythons or ()))


def python_version_of(interpreter: str) -> str | None:
    """The X.Y a name such as python3.11 pins, None where it says no minor version (python3, a path)."""
    m = re.search(r"python(\d)\.(\d+)$", interpreter)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def python_problem(venv: VenvPlan, found: dict | None) -> str | None:
    """Why the host's interpreter cannot make this venv: absent, no venv module or pip bootstrap (Debian's
    python3-venv), or not a Python the lock's wheels or the recipe need. `found`: the probe's reading of it."""
    if not found or not found.get("version"):
        return f"{venv.python} is not on the host (install it, or name the interpreter in venv_python)"
    version = found["version"]
    short = ".".join(version.split(".")[:2])
    if not found.get("venv"):
        return (f"{venv.python} ({version}) cannot make a venv: its venv module or ensurepip is missing "
                f"(Debian/Ubuntu: apt install python{short}-venv)")
    if venv.python_needs and short not in venv.python_needs:
        return (f"{venv.python} is Python {version}; the wheelhouse's wheels are built for "
                f"{' or '.join(venv.python_needs)}")
    if venv.python_min and Version(short) < Version(venv.python_min):
        return f"{venv.python} is Python {version}; the recipe's engine needs {venv.python_min} or newer"
    return None


def user_present(passwd: str | None) -> bool:
    return any(line.split(":", 1)[0] == ENGINE_USER for line in (passwd or "").splitlines())


def is_venv_path(path: str) -> bool:
    """Is `path` a program inside one of modelfleet's venvs (a unit's ExecStart)?"""
    return bool(re.fullmatch(re.escape(VENV_ROOT) + r"/[A-Za-z0-9][A-Za-z0-9._+-]*/bin/[^/]+", path))


def retire_command(path: str, kept: frozenset | set) -> str:
    """A retired venv engine's venv, and, where no service of the host runs its engine from a venv any more,
    every other build of that engine (the copies kept for its rollback): nothing of it stays. Plain directories
    only (no link followed)."""
    name = os.path.basename(path)
    engine = name.rsplit("-", 2)[0]
    # Another service still runs a build of this engine: the copies kept for rollback may be its own.
    pattern = shlex.quote(name) if any(k.rsplit("-", 2)[0] == engine for k in kept) else f"{shlex.quote(engine)}-*-*"
    keep = " ".join(shlex.quote(n) for n in sorted(kept)) or "''"
    return (f"cd {VENV_ROOT} 2>/dev/null && for d in {pattern}; do "
            f"case \" {keep} \" in *\" $d \"*) continue;; esac; "
            "if [ -d \"$d\" ] && [ ! -L \"$d\" ]; then rm -rf --one-file-system -- \"$d\" "
            f"{WHEELHOUSE_ROOT}/\"$d\"; fi; done; true")


def venv_path(engine: str, version: str, digest: str) -> str:
    return f"{VENV_ROOT}/{engine}-{version}-{digest[:DIGEST_LENGTH]}"


def build_command(venv: VenvPlan) -> str:
    """Build the venv in place (a venv's scripts name their own path: it cannot be built elsewhere and moved),
    from the lock pushed to the staging directory: the named interpreter makes it, its own pip installs every
    requirement with its hash checked and no dependency resolved beyond the lock, and the marker goes last. A
    build that did not finish is removed first. The staging directory (the wheelhouse's copy) goes after."""
    q = shlex.quote
    lock = f"{venv.staging}/requirements.txt"
    source = (["--no-index", "--find-links", venv.staging] if venv.wheelhouse
              else ["--index-url", venv.index_url] if venv.index_url else [])
    pip = [f"{venv.path}/bin/python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
           "--no-deps", "--require-hashes", "--only-binary=:all:" if venv.wheelhouse else "--prefer-binary",
           *source, "-r", lock]
    steps = [
        "set -e", "umask 022",
        f"rm -rf --one-file-system {q(venv.path)}",
        f"{q(venv.python)} -m venv {q(venv.path)}",
        # No user or site configuration may point pip elsewhere than this lock and source.
        "PIP_CONFIG_FILE=/dev/null " * bool(venv.wheelhouse or venv.index_url) + " ".join(map(q, pip)),
        f"install -m 0644 {q(lock)} {q(venv.path + '/' + LOCK_COPY)}",
        f"touch {q(venv.marker)}",
        f"rm -rf --one-file-system {q(venv.staging)}",
    ]
    return "; ".join(steps)


def prune_wanted(entries: list[str] | None, in_use: set[str]) -> bool:
    """Does the venv root hold, for some engine, more venvs than those in use and the KEEP kept for rollback?"""
    count: dict[str, int] = {}
    for name in entries or []:
        if name not in in_use and _NAME.match(name) and name.count("-") >= 2:
            count[name.rsplit("-", 2)[0]] = count.get(name.rsplit("-", 2)[0], 0) + 1
    return any(n > KEEP for n in count.values())


def prune_command(in_use: set[str], root: str = VENV_ROOT) -> str:
    """Remove, per engine, the venvs beyond the KEEP newest finished builds (by their marker's time) that no
    service uses, and unfinished builds nobody uses. Plain directories of root's own tree only (-P: no link)."""
    keep = " ".join(shlex.quote(n) for n in sorted(in_use)) or "''"
    return (f"cd {shlex.quote(root)} && for engine in $(find . -mindepth 1 -maxdepth 1 -type d -printf '%f\\n' "
            "| sed -E 's/-[^-]+-[^-]+$//' | sort -u); do n=0; "
            f"for d in $(ls -1dt -- \"$engine\"-*-*/{COMPLETE} 2>/dev/null | cut -d/ -f1) "
            f"$(for u in \"$engine\"-*-*; do [ -e \"$u/{COMPLETE}\" ] || echo \"$u\"; done); do "
            f"case \" {keep} \" in *\" $d \"*) continue;; esac; "
            f"if [ -e \"$d/{COMPLETE}\" ] && [ $n -lt {KEEP} ]; then n=$((n + 1)); continue; fi; "
            "if [ -d \"$d\" ] && [ ! -L \"$d\" ]; then rm -rf --one-file-system -- \"$d\"; fi; done; done")
