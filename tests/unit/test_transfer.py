"""Moving verified files between hosts (modelfleet.host.transfer): who copies from whom, wave by wave, the peer
server's transient unit, and the fetch command a host runs."""

import json
from types import SimpleNamespace

from modelfleet.host.transfer import FETCH, VENV, _fetch_command, fanout_unit, fanout_waves


def test_fanout_waves_serve_at_most_width_peers_per_holder_and_grow_as_a_tree():
    members = [f"h{i}" for i in range(12)]
    waves = fanout_waves(members, {"h0"}, 2)
    assert waves[0] == {"h1": "h0", "h2": "h0"}
    assert waves[1] == {"h3": "h2", "h4": "h2", "h5": "h1", "h6": "h1", "h7": "h0", "h8": "h0"}
    assert waves[2] == {"h9": "h8", "h10": "h8", "h11": "h7"}  # the newest holders: the seed rests
    copied = [target for wave in waves for target in wave]
    assert sorted(copied) == sorted(members[1:])  # each missing host exactly once
    for number, wave in enumerate(waves):
        holders = {"h0"} | {t for earlier in waves[:number] for t in earlier}
        assert set(wave.values()) <= holders  # a source holds a verified copy before its wave
        assert max(list(wave.values()).count(s) for s in set(wave.values())) <= 2


def test_fanout_waves_take_log_n_waves_and_the_width_of_a_star_takes_one():
    members = [f"h{i}" for i in range(1000)]
    assert len(fanout_waves(members, {"h0"}, 8)) == 4  # 9, 81, 729, then the rest
    assert len(fanout_waves(members, {"h0"}, 999)) == 1
    assert fanout_waves(members[:5], set(members[:5]), 8) == []  # nothing missing: no wave


def test_hosts_that_already_hold_the_checkpoint_serve_from_the_first_wave():
    waves = fanout_waves(["a", "b", "c", "d", "e"], {"a", "c"}, 1)
    assert waves == [{"b": "c", "d": "a"}, {"e": "d"}]


def test_each_group_gets_its_own_server_unit_and_the_hub_fetch_runs_in_the_hub_clients_venv():
    assert fanout_unit("kimi-k3") == "modelfleet-fanout-kimi-k3"
    assert fanout_unit("cache-0123456789abcdef") != fanout_unit("kimi-k3")
    hub = str(_fetch_command("/etc/modelfleet/job.json", "hub", None, False))
    assert hub.startswith(f"{VENV}/bin/python {FETCH} /etc/modelfleet/job.json hub")
    peer = str(_fetch_command("/j.json", "peer", "http://10.0.0.1:18431/", True, "b300-01"))
    assert peer == f"python3 {FETCH} /j.json peer http://10.0.0.1:18431/ --reverify --source-name=b300-01"


def test_a_holders_index_becomes_a_job_only_with_sizes_and_sha256s_of_paths_inside():
    from modelfleet.host.transfer import checked_index
    good = {"triton/k.cubin": {"size": 3, "sha256": "a" * 64, "mtime": 1.0}}
    assert checked_index(good, "h") == {"triton/k.cubin": {"size": 3, "sha256": "a" * 64, "blob_id": None}}
    for bad in ({"../escape": {"size": 1, "sha256": "a" * 64}}, {"/etc/x": {"size": 1, "sha256": "a" * 64}},
                {".modelfleet-manifest.json": {"size": 1, "sha256": "a" * 64}}, {"k": {"size": 1, "sha256": None}},
                {"k": {"size": "1", "sha256": "a" * 64}}, {"a//b": {"size": 1, "sha256": "a" * 64}}):
        try:
            checked_index(bad, "gpu-01:/cache")
        except ValueError as error:
            assert "gpu-01:/cache" in str(error)
        else:
            raise AssertionError(f"accepted {bad}")


def test_a_receiver_whose_source_failed_may_turn_to_the_sources_serving_by_its_wave():
    from modelfleet.host.transfer import wave_sources
    waves = fanout_waves([f"h{i}" for i in range(7)], {"h0"}, 2)
    assert wave_sources(waves, 1) == ["h0"]
    assert set(wave_sources(waves, 2)) == {"h0", "h1", "h2"}


def test_the_control_node_takes_a_seeds_piece_list_only_whole_and_well_formed():
    from modelfleet.host.transfer import PIECE_SIZE, checked_pieces
    files = {"a.safetensors": {"size": 2 * PIECE_SIZE + 1}, "config.json": {"size": 10}, "empty": {"size": 0}}
    good = {"piece_size": PIECE_SIZE, "files": {"a.safetensors": ["a" * 64] * 3, "config.json": ["b" * 64],
                                                "empty": [], "extra.bin": ["c" * 64]}}
    assert checked_pieces(good, files, "gpu-01:/m") == {"a.safetensors": ["a" * 64] * 3, "config.json": ["b" * 64],
                                                        "empty": []}  # what the job lists, nothing else
    for bad in ({**good, "piece_size": PIECE_SIZE // 2},
                {**good, "files": {**good["files"], "a.safetensors": ["a" * 64] * 2}},  # a piece short
                {**good, "files": {**good["files"], "config.json": ["B" * 64]}},  # not a sha256
                {**good, "files": {k: v for k, v in good["files"].items() if k != "config.json"}}):
        try:
            checked_pieces(bad, files, "gpu-01:/m")
        except ValueError as error:
            assert "gpu-01:/m" in str(error)
        else:
            raise AssertionError(f"accepted {bad}")


class Written:
    """A host as the transfer's FunctionCommands see it: what it was given in files, and its commands' answers."""

    def __init__(self, name: str):
        self.name, self.files = name, {}

    def put_file(self, content, dest, remote_temp_filename=None):
        self.files[dest] = json.loads(content.read())
        return True

    def run_shell_command(self, command, **_):
        return True, SimpleNamespace(stdout_lines=[], stderr_lines=[], stdout="")


def test_each_server_proves_itself_with_its_own_key_and_a_receiver_gets_only_its_sources_keys():
    """A receiver that held every server's key (or one key for all) could answer for any of them, and so could
    whoever read its job: it gets the keys of the hosts it copies from, and nothing of the others."""
    from modelfleet.base import runscope
    from modelfleet.host.transfer import _copy_from_peer, _serve_job, _swarm_copy, group_pieces, held_files

    state = SimpleNamespace(failed_hosts=[], print_output=False, print_input=False)
    hosts = {name: Written(name) for name in ("a", "b", "c", "d")}
    with runscope.scope():
        held_files(("g", "a")).update({"m.bin": {"size": 1, "sha256": "0" * 64, "blob_id": None}})
        for name in ("a", "b"):
            assert _serve_job(state, hosts[name], "/etc/mf/fanout-g.json", "g", "/srv/m", f"10.0.0.{ord(name)}",
                              18431, ("g", "a"), None, 120)
        served = {name: hosts[name].files["/etc/mf/fanout-g.json"] for name in ("a", "b")}
        assert [served[n]["name"] for n in ("a", "b")] == ["a", "b"]
        assert served["a"]["proof_key"] != served["b"]["proof_key"] and served["a"]["token"] == served["b"]["token"]
        urls = {name: f"http://10.0.0.{ord(name)}:18431/" for name in hosts}
        assert _copy_from_peer(state, hosts["c"], "/etc/mf/job.json", {"files": {}}, "g", "a", ["b"], urls, False, [])
        tree_job = hosts["c"].files["/etc/mf/job.peer.json"]
        assert tree_job["proofs"] == {"a": served["a"]["proof_key"]}
        group_pieces("g").update({"m.bin": ["0" * 64]})
        assert _swarm_copy(state, hosts["d"], "/etc/mf/job.json", {"files": {}}, "g", {"a": urls["a"], "b": urls["b"]},
                           ["a"], None, False, [])
        swarm_job = hosts["d"].files["/etc/mf/job.peer.json"]
        assert swarm_job["proofs"] == {"a": served["a"]["proof_key"], "b": served["b"]["proof_key"]}


def test_a_host_gone_while_its_job_file_is_written_is_named_not_its_sftp_subsystem():
    from paramiko.ssh_exception import SSHException
    from pyinfra.api.exceptions import ConnectError

    from modelfleet.host.transfer import _put_secret

    class Gone:
        name = "gpu-3"

        def put_file(self, *args, **kwargs):  # what pyinfra raises once the host's transport is gone
            try:
                raise SSHException("SSH session not active")
            except SSHException as error:
                raise ConnectError("Unable to establish SFTP connection. Check that the SFTP subsystem for the "
                                   "SSH service at gpu-3 is enabled.") from error

    why = _put_secret(Gone(), "/etc/modelfleet/x.peer.json", "{}")
    assert why.startswith("host gpu-3 stopped answering over SSH while this run wrote /etc/modelfleet/x.peer.json")
    assert "SSH session not active" in why and "SFTP" not in why
