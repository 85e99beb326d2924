"""Verified files from one host to another: the fetch script on the host (files/modelfleet_fetch.py), its
peer server as an unprivileged transient unit, and the waves in which holders serve the hosts that lack a copy.
The checkpoint fan-out (stage model) and the engine caches' (stage engine_cache) both move their files so.

Trust (docs/design.md, "Trust between hosts"): each group's servers and receivers share a secret made for the
run on the control node; it reaches hosts only in 0600 job files (the server's is opened by systemd and given
on stdin). Each server also gets a proof key of its own (per run and host), with which it answers a receiver's
challenge for its host and address; a receiver's job holds the keys of its sources only. A server serves the
names its job lists; the file list, sizes and sha256s a receiver checks come from the control node (the hub's
metadata, or a cache holder's index read over SSH), never from the source."""

from __future__ import annotations

import json
import posixpath
import re
import secrets
import shlex
from io import BytesIO

from pyinfra import host
from pyinfra.api import FunctionCommand, StringCommand, operation

from modelfleet.base import runscope
from modelfleet.base.grammar import slug
from modelfleet.base.host_commands import TOOLS_BIN
from modelfleet.host.operations.report import note, refuse

FETCH = f"{TOOLS_BIN}/modelfleet_fetch.py"
SWARM = f"{TOOLS_BIN}/modelfleet_swarm.py"  # imported by FETCH for a swarm's copy and its server
PIECE_SIZE = 8 << 20  # the swarm's piece: a receiver serves a piece as soon as it has checked it
HAVE = ".modelfleet-have.json"  # a swarm receiver's verified pieces, read by its server (modelfleet_swarm.HAVE)
VENV = "/opt/modelfleet/hf-venv"  # the hub client the fetch script downloads with
FANOUT_PORT = 18431
# The peer server's lifetime: the group's missing bytes at this floor rate, plus a margin. A control node
# killed mid-copy cannot stop it; this bounds it, and the next run stops a leftover before starting its own.
FANOUT_FLOOR_BYTES_S = 25e6
FANOUT_MARGIN_S = 300
# The peer server's unit: no root, no capability, the filesystem read-only, no devices; its job (the token and
# the names it serves) comes on stdin from a 0600 file that systemd opens for it.
SERVER_PROPERTIES = ("DynamicUser=yes", "NoNewPrivileges=yes", "CapabilityBoundingSet=", "ProtectSystem=strict",
                     "ProtectHome=read-only", "PrivateTmp=yes", "PrivateDevices=yes",
                     "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX", "StandardOutput=journal",
                     "StandardError=journal")
SHA256_RE = re.compile(r"[0-9a-f]{64}")


def fanout_token(group: str) -> str:
    """The group's secret for this run (made once per run on the control node; never in argv or output)."""
    tokens = runscope.slot("fanout-tokens", dict)
    return tokens.setdefault(group, secrets.token_hex(32))


def proof_key(group: str, name: str) -> str:
    """Host `name`'s key for proving, in this group's fan-out, that its listener is its server (the answer to
    a receiver's nonce binds the host's name and the address the receiver dialled): made once per run on the
    control node, given to that host's server and to the receivers that copy from it, never to others."""
    keys = runscope.slot("fanout-proof-keys", dict)
    return keys.setdefault((group, name), secrets.token_hex(32))


def held_files(key: tuple) -> dict:
    """This run's file lists, as the control node read them, by (group, holder): what a holder serves and what
    its receivers check."""
    return runscope.slot("fanout-files", dict).setdefault(key, {})


def checked_index(listed: dict, where: str) -> dict:
    """A holder's index as a job's files: every path inside the directory, every entry with a size and a
    sha256, or a ValueError naming the first that is not."""
    files = {}
    for rel, entry in listed.items():
        parts = rel.split("/")
        if any(part in ("", ".", "..") for part in parts) or parts[-1].startswith(".modelfleet-") \
                or not isinstance(entry.get("size"), int) or not SHA256_RE.fullmatch(str(entry.get("sha256"))):
            raise ValueError(f"{where}: the index lists {rel!r} outside its directory or without a size and sha256")
        files[rel] = {"size": entry["size"], "sha256": entry["sha256"], "blob_id": None}
    return files


def fanout_address(plan) -> str:
    """Where a host's peer server listens and its peers reach it: the pool network (fabric_address), else the
    SSH address."""
    return plan.fabric_address or plan.address


def serve_job_path(config_dir: str, group: str) -> str:
    return f"{config_dir}/fanout-{slug(group, '-')}.json"


def _put_secret(host, dest: str, content: str) -> str | None:
    """Write a 0600 file in a 0700 directory (the config directory) at execution time, its content never in a
    command line. None when written, else the one line saying why not: a host that went away mid-run is named
    as such (pyinfra's own error would send the operator to check its SFTP subsystem)."""
    directory_, name = posixpath.split(dest)
    temp = posixpath.join(directory_, f".{name}.modelfleet-tmp")
    try:
        if not host.put_file(BytesIO(content.encode()), dest, remote_temp_filename=temp):
            return f"could not write {dest}"
        ok, _ = host.run_shell_command(StringCommand("chmod", "0600", shlex.quote(dest)), print_output=False)
    except Exception as error:  # paramiko's and pyinfra's connection errors share no base worth naming
        cause = str(error.__cause__ or error).strip().splitlines()[:1] or [type(error).__name__]
        return (f"host {host.name} stopped answering over SSH while this run wrote {dest} ({cause[0][:200]}): the "
                "host or its network went down; nothing more ran there, the other hosts go on; bring it back and "
                "re-run")
    return None if ok else f"could not make {dest} 0600"


def _serve_job(state, host, dest: str, group: str, directory_: str, address: str, port: int, files_key: tuple,
               rate_mb_s: int | None, idle_s: int, swarm: bool = False) -> bool:
    """FunctionCommand body: the server's job, with the names the control node holds for this holder now (a
    swarm's receiver: the names it will hold, served piece by piece as its fetch verifies them)."""
    files = held_files(files_key)
    job = {"dir": directory_, "address": address, "port": port, "token": fanout_token(group), "name": host.name,
           "proof_key": proof_key(group, host.name), "files": sorted(files),
           "sizes": {rel: meta["size"] for rel, meta in files.items()}, "rate_mb_s": rate_mb_s, "idle_s": idle_s,
           "swarm": swarm, "piece_size": PIECE_SIZE}
    why = _put_secret(host, dest, json.dumps(job))
    return not why or refuse(state, host, [why])


def group_pieces(group: str) -> dict:
    """The group's piece digests for this run ({rel: [sha256]}), as the control node read them from its seed."""
    return runscope.slot("fanout-pieces", dict).setdefault(group, {})


def checked_pieces(listed: dict, files: dict, where: str) -> dict:
    """The seed's piece list as receivers' jobs take it: for every file of `files`, ceil(size / PIECE_SIZE)
    sha256s, or a ValueError naming the first file that does not have them."""
    if listed.get("piece_size") != PIECE_SIZE:
        raise ValueError(f"{where}: piece size {listed.get('piece_size')!r}, not {PIECE_SIZE}")
    out = {}
    for rel, meta in files.items():
        digests = listed.get("files", {}).get(rel)
        if not isinstance(digests, list) or len(digests) != -(-meta["size"] // PIECE_SIZE) \
                or not all(SHA256_RE.fullmatch(str(d)) for d in digests):
            raise ValueError(f"{where}: no piece digests for {rel} of its {meta['size']} bytes")
        out[rel] = digests
    return out


def _read_pieces(state, host, group: str, directory_: str, files: dict) -> bool:
    """FunctionCommand body, on the seed: its verified copy's piece digests, read over SSH for the receivers."""
    command = StringCommand(*map(shlex.quote, ["python3", FETCH, "pieces", directory_, str(PIECE_SIZE)]))
    ok, output = host.run_shell_command(command, print_output=False)
    if not ok:
        return refuse(state, host, output.stderr_lines or [f"could not read the piece digests of {directory_}"])
    try:
        group_pieces(group).update(checked_pieces(json.loads(output.stdout), files, f"{host.name}:{directory_}"))
        runscope.slot("fanout-pieces-from", dict)[group] = host.name
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        return refuse(state, host, [str(error)])
    return True


@operation(is_idempotent=False)
def pieces_read(group: str, directory_: str, files: dict, needed: bool):
    """Read the seed's piece digests (computed once per file version and kept beside its copy)."""
    if not needed:
        host.noop("no piece list needed from this host")
        return
    yield FunctionCommand(_read_pieces, (group, directory_, files), {})


def _swarm_copy(state, host, job_path: str, job: dict, group: str, peers: dict[str, str], holders: list[str],
                rate_mb_s: int | None, reverify: bool, restart: list[str]) -> bool:
    """FunctionCommand body: copy from every peer of the group still in the run at once (modelfleet_swarm)."""
    failed = {h.name for h in state.failed_hosts}
    pieces = group_pieces(group)
    if holders and not set(holders) - failed:  # the receivers alone hold no piece yet
        return refuse(state, host, [f"copy source {', '.join(holders)} failed earlier in this run (see its error): "
                                    "nothing to copy from; fix it and re-run"])
    if not pieces:
        return refuse(state, host, ["no piece digests from the group's seed (it failed earlier in this run, see "
                                    "its error): nothing to copy from; fix it and re-run"])
    usable = {name: url for name, url in peers.items() if name not in failed}
    peer_job = f"{job_path.removesuffix('.json')}.peer.json"
    # Each receiver first asks for its own share of the pieces no one else holds yet, so the seed's uplink sends
    # each piece once and the receivers trade the rest (BitTorrent's super-seeding, decided here instead).
    receivers = sorted({host.name, *(name for name in usable if name not in holders)})
    body = {**job, "token": fanout_token(group), "pieces": pieces, "piece_size": PIECE_SIZE, "peers": usable,
            "proofs": {name: proof_key(group, name) for name in usable},
            "rate_mb_s": rate_mb_s, "stripe": [receivers.index(host.name), len(receivers)],
            "pieces_from": runscope.slot("fanout-pieces-from", dict).get(group),
            "server_unit": fanout_unit(group)}  # its own server stops with a failed copy (no later operation)
    if why := _put_secret(host, peer_job, json.dumps(body)):
        return refuse(state, host, [why])
    return _run_fetch(state, host, _fetch_command(peer_job, "swarm", None, reverify), "the group's peers",
                      restart)


@operation(is_idempotent=False)
def swarm_copied(job_path: str, job: dict, group: str, peers: dict[str, str], holders: list[str], needed: bool,
                 rate_mb_s: int | None = None, reverify: bool = False, restart: list[str] = ()):
    """Copy this group's checkpoint piece by piece from all its `peers` at once (`holders`: those with a whole
    copy), serving verified pieces meanwhile."""
    if not needed:
        host.noop("this host holds the checkpoint")
        return
    yield FunctionCommand(_swarm_copy, (job_path, job, group, peers, list(holders), rate_mb_s, reverify,
                                        list(restart)), {})


def _fetch_command(job: str, mode: str, source: str | None, reverify: bool,
                   source_host: str | None = None) -> StringCommand:
    python = f"{VENV}/bin/python" if mode == "hub" else "python3"
    argv = [python, FETCH, job, mode] + ([source] if source else []) + (["--reverify"] if reverify else [])
    argv += [f"--source-name={source_host}"] if source_host else []
    return StringCommand(*map(shlex.quote, argv))


def _copy_from_peer(state, host, job_path: str, job: dict, group: str, planned: str, alternatives: list[str],
                    urls: dict[str, str], reverify: bool, restart: list[str]) -> bool:
    """FunctionCommand body, at execution time: copy from `planned`, or from another holder serving this group
    when `planned` failed earlier in this run (its port taken, its index refused). The receiver's job (0600,
    read once, then removed by the script) holds the run's token and the files as the control node knows them:
    the checkpoint's from the hub, a cache's from its holder's index."""
    cache = job.get("kind") == "cache"
    failed = {h.name for h in state.failed_hosts}
    usable = [name for name in dict.fromkeys([planned, *alternatives])
              if name not in failed and (not cache or held_files((group, name)))]
    if not usable:
        if cache:
            return note(state, host, f"no engine cache copy for {job['commit']}: its source {planned} failed "
                                     "earlier in this run (see its error); this host's engine compiles its own")
        return refuse(state, host, [f"copy source {planned} failed earlier in this run (see its error): nothing "
                                    "to copy from; fix it and re-run"])
    source = usable[0]
    if source != planned:
        note(state, host, f"copy source {planned} failed earlier in this run: copying from {source} instead")
    files = dict(held_files((group, source))) if cache else job["files"]
    peer_job = f"{job_path.removesuffix('.json')}.peer.json"
    body = {**job, "files": files, "token": fanout_token(group), "proofs": {source: proof_key(group, source)}}
    if why := _put_secret(host, peer_job, json.dumps(body)):
        return refuse(state, host, [why])
    if not _run_fetch(state, host, _fetch_command(peer_job, "peer", urls[source], reverify, source),
                      f"peer {source}", restart):
        return False
    held_files((group, host.name)).update(files)  # a holder for the next waves
    return True


def _run_fetch(state, host, command: StringCommand, source: str, restart: list[str]) -> bool:
    """Run the fetch script; each corrupt file it replaced is named in one line (host, file, expected and found
    digest, the source of the good bytes), and the engines that loaded the bad bytes (`restart`: their units)
    restart. A failure is the script's one line."""
    ok, output = host.run_shell_command(command, print_output=state.print_output, print_input=state.print_input)
    if not ok:
        return refuse(state, host, output.stderr_lines or [f"the fetch from {source} failed"])
    report = next((json.loads(line) for line in reversed(output.stdout_lines) if line.startswith("{")), {})
    for bad in report.get("refused_pieces", []):
        note(state, host, f"refused piece {bad['piece']} of {report.get('dest')}/{bad['file']} sent by peer "
                          f"{bad['peer']}: sha256 {bad['found']}, expected {bad['expected']}; nothing more was asked "
                          f"of {bad['peer']}, the piece came from another peer; {bad['peer']}'s copy is bad: run with "
                          f"model_reverify=true on {bad['peer']} (--limit {bad['peer']})")
    for name in report.get("unproven_peers", []):
        note(state, host, f"peer {name} did not prove it is this run's fan-out server: nothing was asked of it")
    for fixed in report.get("repaired", []):
        note(state, host, f"repaired on {host.name}: {report.get('dest')}/{fixed['file']} was corrupt (expected "
                          f"{fixed['expected']}, found {fixed['found']}); replaced from {source}")
    if report.get("repaired") and restart:  # those running now: a unit not there yet starts on the new bytes
        script = 'for u; do if systemctl is-active --quiet "$u"; then systemctl restart "$u" && echo "$u"; fi; done'
        ok, output = host.run_shell_command(StringCommand("sh", "-c", shlex.quote(script), "sh",
                                                          *map(shlex.quote, restart)),
                                            print_output=state.print_output, print_input=state.print_input)
        if not ok:
            return refuse(state, host, output.stderr_lines or [f"could not restart {', '.join(restart)}"])
        if output.stdout_lines:
            note(state, host, f"restarted {', '.join(output.stdout_lines)}: its engine had loaded the corrupt bytes")
    return True


@operation(is_idempotent=False)
def checkpoint_fetched(job: str, mode: str, source: str | None, missing: list[str], reverify: bool,
                       restart: list[str] = (), source_name: str = ""):
    """Run the fetch script from the hub or a mirror: it re-checks what is present, fetches `missing` and what
    fails its hash (a repair named, the engines in `restart` restarted)."""
    if not missing:
        host.noop("checkpoint complete (manifest, sizes and mtimes match)")
        return
    yield FunctionCommand(_run_fetch, (_fetch_command(job, mode, source, reverify), source_name or mode,
                                       list(restart)), {})


@operation(is_idempotent=False)
def peer_copied(job_path: str, job: dict, group: str, source: str | None, alternatives: list[str],
                urls: dict[str, str], needed: bool, reverify: bool = False, restart: list[str] = ()):
    """Copy this group's files from a peer holding them (`source`; another of `alternatives` if it failed)."""
    if not source or not needed:
        host.noop("nothing to copy from a peer in this wave")
        return
    yield FunctionCommand(_copy_from_peer, (job_path, job, group, source, alternatives, urls, reverify,
                                            list(restart)), {})


def fanout_unit(group: str) -> str:
    return f"modelfleet-fanout-{slug(group, '-')}"


@operation(is_idempotent=False)
def fanout_serving(group: str, directory_: str, address: str, port: int, serve: bool, needed: bool,
                   config_dir: str = "", files_key: tuple = (), lifetime_s: int = 0, leftover: bool = False,
                   rate_mb_s: int | None = None, idle_s: int = 120, swarm: bool = False):
    """Serve this host's verified copy to the group's peers for at most `lifetime_s`, ending sooner when no
    request came for `idle_s` (the run that started it is gone however it ended: its receivers went with it),
    proven to be this run's server at every wave it serves (started again where it ended between waves), or
    stop it. A unit left running by an earlier run that died is stopped first."""
    unit = fanout_unit(group)
    if serve and leftover:  # whether or not this run serves: the run that started it is gone (the run lock)
        yield FunctionCommand(note, (f"stopping {unit}, left running by an earlier run that did not finish",), {})
        yield StringCommand("systemctl", "stop", shlex.quote(unit), "||", "true")
        yield StringCommand("systemctl", "reset-failed", shlex.quote(unit), "2>/dev/null", "||", "true")
    if not needed:
        if not (serve and leftover):
            host.noop("no peer needs a copy from this host")
        return
    if serve:
        job = serve_job_path(config_dir, group)
        yield FunctionCommand(_serve_job, (job, group, directory_, address, port, files_key, rate_mb_s, idle_s,
                                           swarm), {})
        argv = ["systemd-run", f"--unit={unit}", f"--property=RuntimeMaxSec={lifetime_s}", "--collect",
                *(f"--property={p}" for p in SERVER_PROPERTIES), f"--property=StandardInput=file:{job}",
                # PrivateTmp hides /tmp: the served tree is bound in read-only at its own path, wherever it is
                f"--property=BindReadOnlyPaths={directory_}", "python3", FETCH, "serve"]
        start = " ".join(map(shlex.quote, argv))
        yield StringCommand("sh", "-c", shlex.quote(f"systemctl is-active --quiet {shlex.quote(unit)} || {start}"))
        yield StringCommand(*map(shlex.quote, ["python3", FETCH, "probe", job, host.name]))
    else:
        # A server that already ended (its lifetime, its host restarted) left nothing to stop: say nothing. Its
        # job goes with it (the run's token is worth nothing once the run ends, but need not stay).
        # A swarm receiver's list of verified pieces goes too: only its own server read it.
        yield StringCommand("sh", "-c", shlex.quote(f"rm -f {shlex.quote(serve_job_path(config_dir, group))} "
                                                    f"{shlex.quote(posixpath.join(directory_, HAVE))}; "
                                                    f"systemctl is-active --quiet {shlex.quote(unit)} || exit 0; "
                                                    f"systemctl stop {shlex.quote(unit)}"))


def wave_sources(waves: list[dict[str, str]], number: int) -> list[str]:
    """Who serves the group by wave `number` (1-based): the sources of that wave and the earlier ones (a
    server started at a host's first wave as a source runs until the run stops it)."""
    return list(dict.fromkeys(source for wave in waves[:number] for source in wave.values()))


def fanout_waves(members: list[str], holders: set[str], width: int) -> list[dict[str, str]]:
    """Who copies from whom, wave by wave ({target: source} each): every holder serves at most `width` of the
    members still missing per wave, and those served become holders for the next wave. Wave k reaches
    (1 + width)^k holders, so N hosts take about log(N) waves and no host serves more than `width` at once.
    The newest holders are asked first: a short last wave spares the seed, which also fetched from the hub."""
    sources = [name for name in members if name in holders]
    waiting = [name for name in members if name not in holders]
    waves = []
    while waiting and sources:
        wave = {}
        for source in reversed(sources):
            for target in waiting[:width]:
                wave[target] = source
            waiting = waiting[width:]
        waves.append(wave)
        sources += list(wave)
    return waves
