"""The swarm's piece logic, and the swarm itself on this machine (loopback, the real fetch script and servers): a
receiver takes pieces from several peers at once, each checked against the control node's digests; a peer's bad
piece is never written and that peer is named; a receiver's own server sends only the pieces it verified."""

import hashlib
import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from modelfleet.files import modelfleet_swarm as swarm
from modelfleet.files.modelfleet_fetch import Tree, challenge
from modelfleet.host import transfer
from tests.helpers.fetch_peer import FETCH, KEY, TOKEN
from tests.helpers.listener import free_port

PIECE = 256 << 10


def test_piece_arithmetic_covers_every_byte_once():
    assert [swarm.piece_count(n, PIECE) for n in (0, 1, PIECE, PIECE + 1)] == [0, 1, 1, 2]
    size = 3 * PIECE + 5
    ranges = [swarm.piece_range(size, PIECE, i) for i in range(swarm.piece_count(size, PIECE))]
    assert ranges == [(0, PIECE), (PIECE, PIECE), (2 * PIECE, PIECE), (3 * PIECE, 5)]
    assert swarm.piece_of(f"bytes={PIECE}-{2 * PIECE - 1}", size, PIECE) == 1
    assert swarm.piece_of(f"bytes={3 * PIECE}-{3 * PIECE + 4}", size, PIECE) == 3
    # Anything but exactly one whole piece is refused: a range across pieces could mix verified and unverified.
    for bad in (f"bytes=0-{PIECE}", "bytes=1-10", f"bytes={4 * PIECE}-{4 * PIECE + 1}", "bytes=0-", "items=0-1"):
        assert swarm.piece_of(bad, size, PIECE) is None


def test_the_package_and_the_host_programs_agree_on_piece_size_and_have_file():
    assert (transfer.PIECE_SIZE, transfer.HAVE) == (swarm.PIECE, swarm.HAVE)


def test_a_receivers_server_sends_only_verified_pieces_of_listed_files():
    have = {"files": {"a/model.bin": {"have": "0110", "partial": ".model.bin.77.5eed.modelfleet-partial"},
                      "b.bin": {"have": "1", "partial": "../../etc/shadow"},
                      "unlisted.bin": {"have": "*", "partial": None},
                      "done.bin": {"have": "*", "partial": None}}}
    view = swarm.HaveView(lambda: json.dumps(have), frozenset({"a/model.bin", "b.bin", "done.bin"}), complete=False)
    assert view.source("a/model.bin", 1) == "a/.model.bin.77.5eed.modelfleet-partial"
    assert view.source("a/model.bin", 0) is None and view.source("a/model.bin", 9) is None
    assert view.source("a/model.bin", None) is None  # not whole yet
    assert view.source("b.bin", 0) is None  # a partial name that is not the file's own
    assert view.source("unlisted.bin", None) is None
    assert view.source("done.bin", None) == "done.bin"


def test_pieces_are_computed_once_per_file_version(tmp_path):
    (tmp_path / "m.bin").write_bytes(b"x" * (PIECE + 3))
    first = swarm.pieces_of(Tree(tmp_path), ["m.bin"], PIECE)
    assert first["files"]["m.bin"] == [hashlib.sha256(b"x" * PIECE).hexdigest(), hashlib.sha256(b"xxx").hexdigest()]
    cache = json.loads((tmp_path / swarm.PIECES_CACHE).read_text())
    cache["files"]["m.bin"]["pieces"] = ["f" * 64, "f" * 64]  # a kept list is reused while size and mtime hold
    (tmp_path / swarm.PIECES_CACHE).write_text(json.dumps(cache))
    assert swarm.pieces_of(Tree(tmp_path), ["m.bin"], PIECE)["files"]["m.bin"] == ["f" * 64] * 2
    (tmp_path / "m.bin").write_bytes(b"y" * (PIECE + 3))
    assert swarm.pieces_of(Tree(tmp_path), ["m.bin"], PIECE)["files"]["m.bin"][1] == hashlib.sha256(b"yyy").hexdigest()


def data_of(name: str, size: int) -> bytes:
    return (hashlib.sha256(name.encode()).digest() * (size // 32 + 1))[:size]


@pytest.fixture()
def group(tmp_path):
    """A seed holding two files, and their job metadata: sizes, sha256 and piece digests."""
    seed = tmp_path / "seed"
    (seed / "sub").mkdir(parents=True)
    files = {"sub/model-1.safetensors": 5 * PIECE + 17, "model-2.safetensors": 3 * PIECE, "empty.txt": 0}
    meta = {}
    for rel, size in files.items():
        (seed / rel).write_bytes(data_of(rel, size))
        meta[rel] = {"size": size, "sha256": hashlib.sha256(data_of(rel, size)).hexdigest(), "blob_id": None}
    pieces = swarm.pieces_of(Tree(seed), sorted(files), PIECE)["files"]
    return tmp_path, seed, meta, pieces


def receiver_job(tmp_path, name, meta, pieces, peers, rate_mb_s=None):
    job = tmp_path / f"{name}.json"
    job.write_text(json.dumps({"repo": "org/m", "commit": "c" * 40, "endpoint": "", "dest": str(tmp_path / name),
                               "token_file": None, "files": meta, "token": TOKEN, "pieces": pieces,
                               "piece_size": PIECE, "peers": peers, "rate_mb_s": rate_mb_s, "stall_s": 20,
                               "proofs": dict.fromkeys(peers, KEY)}))
    return job


def server(directory, meta, swarm_mode=False, rate_mb_s=None):
    """A peer server as the unit runs it (its job on stdin): a holder's, or a receiver's (`swarm_mode`: it sends
    only what the have file in its directory says was verified), named as its directory. Returned once its
    challenge is answered."""
    port = free_port()
    job = {"dir": str(directory), "address": "127.0.0.1", "port": port, "token": TOKEN, "files": sorted(meta),
           "name": directory.name, "proof_key": KEY,
           "sizes": {rel: m["size"] for rel, m in meta.items()}, "swarm": swarm_mode, "piece_size": PIECE,
           "rate_mb_s": rate_mb_s}
    proc = subprocess.Popen([sys.executable, FETCH, "serve"], stdin=subprocess.PIPE)
    proc.stdin.write(json.dumps(job).encode())
    proc.stdin.close()
    url = f"http://127.0.0.1:{port}/"
    for _ in range(200):
        if challenge(url, KEY, directory.name, timeout=1) is None:
            return proc, url
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the peer server did not start")


def test_receivers_copy_piece_by_piece_from_each_other_and_the_seed(group):
    tmp_path, seed, meta, pieces = group
    for name in ("r1", "r2"):
        (tmp_path / name).mkdir()
    servers = {"seed": server(seed, meta, rate_mb_s=1)}  # a slow seed: the receivers must help each other
    servers.update({name: server(tmp_path / name, meta, swarm_mode=True) for name in ("r1", "r2")})
    try:
        procs = {name: subprocess.Popen(
            [sys.executable, FETCH, str(receiver_job(tmp_path, name, meta, pieces, {
                o: url for o, (_, url) in servers.items() if o != name})), "swarm"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for name in ("r1", "r2")}
        reports = {}
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            reports[name] = json.loads(out)
    finally:
        for proc, _ in servers.values():
            proc.kill()
    total = sum(m["size"] for m in meta.values())
    for name in ("r1", "r2"):
        for rel in meta:
            assert (tmp_path / name / rel).read_bytes() == data_of(rel, meta[rel]["size"])
        assert reports[name]["refused_pieces"] == [] and sum(reports[name]["bytes_by_peer"].values()) == total
    # The seed's uplink carried less than two copies: the receivers sent each other what they had verified.
    assert sum(reports[name]["bytes_by_peer"]["seed"] for name in ("r1", "r2")) < 2 * total
    assert reports["r1"]["bytes_by_peer"]["r2"] + reports["r2"]["bytes_by_peer"]["r1"] > 0
    have = json.loads((tmp_path / "r1" / swarm.HAVE).read_text())["files"]
    assert {rel: e["have"] for rel, e in have.items()} == {rel: "*" for rel in meta}


def test_a_bad_piece_is_refused_and_its_peer_named(group):
    """The liar holds every piece, one of them changed; the honest peer holds all but that piece at first. The
    receiver must ask the liar for it: the bad bytes are refused and the liar named; the piece comes from the
    honest peer once it has it."""
    tmp_path, seed, meta, pieces = group
    liar, honest, rel = tmp_path / "liar", tmp_path / "honest", "sub/model-1.safetensors"
    for directory in (liar, honest):
        shutil.copytree(seed, directory, ignore=shutil.ignore_patterns(".modelfleet-*"))
    with (liar / rel).open("r+b") as f:  # one piece's bytes changed, sizes the same
        f.seek(2 * PIECE + 5)
        f.write(b"EVIL")
    partial = honest / "sub" / ".model-1.safetensors.1.0a.modelfleet-partial"
    shutil.copyfile(seed / rel, partial)
    held = {r: {"have": "*", "partial": None} for r in meta}
    (honest / swarm.HAVE).write_text(json.dumps({"files": {**held, rel: {"have": "110111", "partial": partial.name}}}))
    servers = {"liar": server(liar, meta), "honest": server(honest, meta, swarm_mode=True)}
    try:
        proc = subprocess.Popen([sys.executable, FETCH, str(receiver_job(
            tmp_path, "r", meta, pieces, {name: url for name, (_, url) in servers.items()})), "swarm"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(3)
        (honest / swarm.HAVE).write_text(json.dumps({"files": held}))
        out, err = proc.communicate(timeout=60)
    finally:
        for server_proc, _ in servers.values():
            server_proc.kill()
    assert proc.returncode == 0, err
    report = json.loads(out)
    got = (tmp_path / "r" / rel).read_bytes()
    assert got == data_of(rel, meta[rel]["size"]) and b"EVIL" not in got
    assert [(r["peer"], r["file"], r["piece"]) for r in report["refused_pieces"]] == [("liar", rel, 2)]
    assert report["refused_pieces"][0]["expected"] == pieces[rel][2]
    # Nothing after the bad piece came from the liar.
    assert report["bytes_by_peer"]["honest"] >= PIECE


def test_the_server_refuses_a_piece_it_has_not_verified(group, tmp_path):
    _, seed, meta, pieces = group
    dest = tmp_path / "partial-host"
    dest.mkdir()
    rel = "model-2.safetensors"
    partial = dest / f".{rel}.99.beef.modelfleet-partial"
    partial.write_bytes(data_of(rel, meta[rel]["size"]))
    (dest / swarm.HAVE).write_text(json.dumps({"files": {rel: {"have": "010", "partial": partial.name}}}))
    proc, url = server(dest, meta, swarm_mode=True)

    def ask(index, token=TOKEN):
        request = urllib.request.Request(url + rel, headers={
            "Authorization": f"Bearer {token}", "Range": f"bytes={index * PIECE}-{(index + 1) * PIECE - 1}"})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, b""

    try:
        assert ask(1) == (206, data_of(rel, meta[rel]["size"])[PIECE:2 * PIECE])
        assert ask(1, token="0" * 64) == (401, b"")
        assert ask(0)[0] == 404 and ask(2)[0] == 404
        whole = urllib.request.Request(url + rel, headers={"Authorization": f"Bearer {TOKEN}"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(whole, timeout=5)
        assert refused.value.code == 404
        have = urllib.request.Request(url + ".modelfleet-have", headers={"Authorization": f"Bearer {TOKEN}"})
        assert json.loads(urllib.request.urlopen(have, timeout=5).read()) == {rel: "010", swarm.SENDING: []}
        with pytest.raises(urllib.error.HTTPError) as anonymous:
            urllib.request.urlopen(url + ".modelfleet-have", timeout=5)
        assert anonymous.value.code == 401
    finally:
        proc.kill()


def test_receivers_first_ask_the_seed_for_disjoint_shares(group):
    """Every piece only the seed holds is in exactly one receiver's share, and each receiver's first choices come
    from its own share: the seed's uplink is not spent twice on one piece while others wait."""
    tmp_path, seed, meta, pieces = group
    shares = []
    for slot in range(3):
        (tmp_path / f"r{slot}").mkdir()
        job = json.loads(receiver_job(tmp_path, f"r{slot}", meta, pieces, {"seed": "http://127.0.0.1:9/"}).read_text())
        receiver = swarm.Swarm({**job, "stripe": [slot, 3]}, sorted(meta), [], lambda *_: None,
                               Tree(tmp_path / f"r{slot}"))
        receiver.views["seed"] = {rel: "*" for rel in meta}
        keys = set(receiver.todo)
        shares.append({key for key in keys if receiver.mine(key)})
        for _ in range(20):
            key, peer = receiver.choose()
            assert peer == "seed" and key in shares[-1]
    assert set().union(*shares) == keys and sum(map(len, shares)) == len(keys)


def test_a_piece_bad_on_every_holder_is_named_not_left_to_the_stall_deadline():
    """Both holders sent bad bytes for a piece: nothing can send it any more; the receiver says so at once."""
    one = object.__new__(swarm.Swarm)
    one.peers = {"a": "http://a", "b": "http://b", "c": "http://c"}
    one.views = {"a": {"w.safetensors": "*"}, "b": {"w.safetensors": "*"}, "c": {"w.safetensors": "10"}}
    one.todo, one.inflight, one.banned = {("w.safetensors", 1)}, set(), {"a": "w.safetensors"}
    assert one.hopeless() is None  # b may still send it
    one.banned["b"] = "w.safetensors"
    said = one.hopeless()
    assert said and "every holder of w.safetensors" in said and "a, b" in said and "model_reverify" in said
    one.views["c"] = {"w.safetensors": "11"}  # a receiver that verified it: it can send it
    assert one.hopeless() is None
    del one.views["c"]  # a peer not heard from yet (or down): not decided
    assert one.hopeless() is None
