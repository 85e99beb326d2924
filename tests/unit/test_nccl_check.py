"""The host-side gate program (files/nccl_check.py): members reach the head in seconds or the pair is named, on
real sockets (before torch is imported, so it runs here), and the HCA loopback's child run and its report."""

import importlib.util
import socket
import threading
import time

import pytest

from modelfleet import FILES_DIR
from tests.helpers.listener import free_port

pytestmark = pytest.mark.slow  # PyTorch's collectives over loopback, with their timeouts

# The reachability check itself, on real sockets (before torch is imported, so it runs here).
spec = importlib.util.spec_from_file_location("nccl_check", FILES_DIR / "nccl_check.py")
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


class Refused(Exception):
    pass


@pytest.fixture
def refusing(monkeypatch):
    def fail(report, message, code=1):
        raise Refused(message)

    monkeypatch.setattr(check, "fail", fail)


def args(rank: int, port: int, timeout: int = 5, ifname: str | None = "lo", addr: str = "127.0.0.1", nnodes=2):
    import argparse

    return argparse.Namespace(nnodes=nnodes, node_rank=rank, master_addr=addr, master_port=port,
                              reach_timeout=timeout, ifname=ifname, backend="gloo")


def test_every_member_reaches_the_head_and_the_port_is_free_for_the_rendezvous(refusing):
    port, out = free_port(), {}
    threads = [threading.Thread(target=lambda r=r: out.__setitem__(r, check.reach(args(r, port, nnodes=3))))
               for r in (0, 1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert set(out) == {0, 1, 2} and all(s < 5 for s in out.values())
    with socket.create_server(("127.0.0.1", port)):  # what the rendezvous binds next
        pass


def test_an_interface_that_is_not_there_fails_at_once_naming_it(refusing):
    started = time.monotonic()
    with pytest.raises(Refused, match="interface nosuch0: No such device"):
        check.reach(args(1, free_port(), ifname="nosuch0", nnodes=2))
    assert time.monotonic() - started < 1


def test_a_member_that_cannot_reach_the_head_fails_within_the_timeout_naming_the_pair(refusing):
    port, started = free_port(), time.monotonic()
    with pytest.raises(Refused, match=rf"node rank 1 cannot reach the head at 127.0.0.1:{port} over lo within 2 s "
                                      r"\(ConnectionRefusedError"):
        check.reach(args(1, port, timeout=2, nnodes=2))
    assert 2 <= time.monotonic() - started < 4


def test_a_head_nobody_reaches_names_the_missing_ranks_and_a_foreign_address_is_refused(refusing):
    with pytest.raises(Refused, match="node rank\\(s\\) 1, 2 did not reach the head at 127.0.0.1:.* within 1 s"):
        check.reach(args(0, free_port(), timeout=1, nnodes=3))
    with pytest.raises(Refused, match="the head cannot listen on 192.0.2.7:"):
        check.reach(args(0, free_port(), addr="192.0.2.7"))



def test_the_hca_loopback_runs_this_host_alone_with_shm_p2p_and_nvls_off(monkeypatch, tmp_path):
    """The child run's command line and environment, and what comes back from its output (a stand-in for
    python3 prints what the check prints: NCCL's lines and the JSON report)."""
    child = tmp_path / "child.sh"
    child.write_text("#!/bin/sh\n"
                     f'echo "$@" > {tmp_path}/argv\n'
                     f'env | grep -E "^NCCL_(SHM|P2P|NVLS|MNNVL)" | sort > {tmp_path}/env\n'
                     "echo 'h:1:2 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; "
                     "OOB eth0:10.0.0.1<0>'\n"
                     "echo 'h:1:2 [0] NCCL INFO Using network IB'\n"
                     'echo \'{"ok": true, "results": '
                     '[{"op": "all_reduce", "bytes": 17179869184, "busbw_gbs": 41.2}]}\'\n')
    monkeypatch.setattr(check.sys, "executable", "/bin/sh")
    monkeypatch.setattr(check.sys, "argv", [str(child)])
    import argparse

    args = argparse.Namespace(master_port=29411, local_procs=8, max_bytes=1 << 34, warmup=5, iters=20, timeout=120)
    result = check.hca_loopback(args)
    assert result["ok"] and result["busbw_gbs"] == 41.2 and result["bytes"] == 1 << 34
    assert [line.split("NCCL INFO ")[1] for line in result["net_lines"]] == [
        "NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.0.0.1<0>", "Using network IB"]
    assert (tmp_path / "env").read_text() == ("NCCL_MNNVL_ENABLE=0\nNCCL_NVLS_ENABLE=0\nNCCL_P2P_DISABLE=1\n"
                                              "NCCL_SHM_DISABLE=1\n")
    argv = (tmp_path / "argv").read_text().split()
    assert argv[argv.index("--nnodes") + 1] == "1" and argv[argv.index("--master-addr") + 1] == "127.0.0.1"
    assert argv[argv.index("--min-bytes") + 1] == argv[argv.index("--max-bytes") + 1] == str(1 << 34)
    assert argv[argv.index("--local-procs") + 1] == "8" and argv[argv.index("--master-port") + 1] == "29412"
    child.write_text("#!/bin/sh\necho '{\"ok\": false, \"error\": \"rank 2: NCCL error: unhandled system error\"}'\n")
    assert check.hca_loopback(args) == {"ok": False, "error": "HCA loopback: rank 2: NCCL error: unhandled system "
                                        "error", "net_lines": []}


def test_the_node_report_takes_the_slowest_rank_and_fails_a_result_any_rank_got_wrong():
    from types import SimpleNamespace

    from modelfleet.files import nccl_check

    args = SimpleNamespace(h2d_bytes=1 << 20, node_rank=1, local_procs=2)
    results = [{"op": "all_reduce", "bytes": 1_000_000}, {"op": "all_gather", "bytes": 2_000_000}]
    gathered = [[(10.0, 1.0), (20.0, 1.0)], [(40.0, 1.0), (5.0, 0.0)]]  # rank 1: slower first, wrong second
    copies = [(1.0, 1.0), (2.0, 2.0), (30.5, 28.25), (31.0, 29.0)]  # node 1 holds ranks 2 and 3
    report = {"ok": False}
    wrong = nccl_check.summarize(report, results, gathered, copies, args, world=2)
    assert wrong == ["all_gather 2000000 B"] and report["ok"] is False
    assert report["error"] == "wrong results: all_gather 2000000 B"
    first = report["results"][0]
    assert first["time_us"] == 40.0 and first["correct"] and first["algbw_gbs"] == 25.0
    assert first["busbw_gbs"] == round(25.0 * nccl_check.BUS_FACTOR["all_reduce"](2), 3)
    assert [h["gpu"] for h in report["h2d"]] == [0, 1] and report["h2d"][0]["h2d_gbs"] == 30.5
