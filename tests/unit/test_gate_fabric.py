"""The gate of a pool across hosts (stages/netcheck.py, files/nccl_check.py): its container carries the pool's
fabric like the engine's, members reach the head in seconds or the pair is named, NCCL's own log decides which
transport ran (verbatim public logs, tests/fixtures/nccl), and HCA loopback figures are held to the catalog and
to the pool's median."""

import importlib.util
import shlex
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from modelfleet import FILES_DIR, render
from modelfleet.catalog import load_catalog
from modelfleet.fabric import HostFabric
from modelfleet.inventory import resolve
from modelfleet.stages import netcheck
from tests.public_samples import public_sample_lines

NCCL = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"
IMAGE = "vllm/vllm-openai@sha256:" + "0" * 64
HCAS = tuple(f"mlx5_{i}" for i in range(8))


def nccl_lines(name: str) -> list[str]:
    return (NCCL / name).read_text().split("# ---\n", 1)[1].splitlines()


def pool(hosts=("t1", "t2"), **extra):
    data = {"hardware": "gb300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": "e" * 40, "pool": "k31",
            **extra}
    resolved = resolve([(h, {**data, "ssh_hostname": f"10.0.0.{i + 1}"}) for i, h in enumerate(hosts)])
    assert not resolved.errors, resolved.errors
    return [resolved.hosts[h].services[0] for h in hosts]


def fabric(host: str, rdma: bool = True, hcas=HCAS[:4], ifname: str = "enP6p3s0f0np0", **extra) -> HostFabric:
    devices = (*(f"/dev/infiniband/uverbs{i}" for i in range(len(hcas))), "/dev/infiniband/rdma_cm") if rdma else ()
    env = {"NCCL_SOCKET_IFNAME": f"={ifname}", "GLOO_SOCKET_IFNAME": ifname,
           **({"NCCL_IB_HCA": "=" + ",".join(hcas)} if rdma else {})}
    return HostFabric(host=host, ifname=ifname, head_address="192.168.40.1", hcas=hcas if rdma else (),
                      env=env, devices=devices, rdma=rdma, **extra)


def argv_of(command: str) -> list[str]:
    return shlex.split(command.rsplit(" < ", 1)[0])


def test_the_gate_container_gets_the_engines_devices_caps_env_and_fabric_head():
    head, worker = pool()
    svc = replace(worker, fabric=fabric("t2"))
    argv = argv_of(netcheck.check_command(svc, IMAGE))
    image_at = argv.index(IMAGE)
    for device in svc.fabric.devices:
        assert argv.index(device) < image_at and argv[argv.index(device) - 1] == "--device"
    assert " ".join(argv[:image_at]).count("--cap-add IPC_LOCK --ulimit memlock=-1") == 1
    assert argv[argv.index("--master-addr") + 1] == "192.168.40.1"  # the fabric's, not the SSH 10.0.0.1
    assert argv[argv.index("--ifname") + 1] == "enP6p3s0f0np0" and "--reach-timeout" in argv
    assert "--hca-loopback" in argv
    # Every variable the gate gets is the engine's, with the same value (NCCL's log settings are the gate's own).
    gate_env = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv[:image_at]) if a == "-e")
    engine_env = dict(line.split("=", 1) for line in render.render_env(svc).splitlines()[1:])
    assert {k: v for k, v in gate_env.items() if k not in netcheck.NCCL_LOG_ENV} == {
        k: v for k, v in engine_env.items() if k.startswith(("NCCL_", "GLOO_"))}
    assert gate_env["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1,mlx5_2,mlx5_3"
    assert gate_env["NCCL_DEBUG"] == "INFO" and gate_env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"


def test_a_socket_only_fabric_gets_no_rdma_devices_caps_or_loopback():
    _, worker = pool()
    argv = argv_of(netcheck.check_command(replace(worker, fabric=fabric("t2", rdma=False)), IMAGE))
    assert "--cap-add" not in argv and "/dev/infiniband/rdma_cm" not in argv and "--hca-loopback" not in argv
    assert "GLOO_SOCKET_IFNAME=enP6p3s0f0np0" in argv and "--reach-timeout" in argv


def test_a_multinode_pool_without_a_fabric_keeps_its_command_and_single_node_gets_nothing_new():
    head, _ = pool()
    argv = argv_of(netcheck.check_command(head, IMAGE))
    assert argv[argv.index("--master-addr") + 1] == "10.0.0.1" and "--ifname" not in argv
    _, worker = pool(gloo_socket_ifname="eth9")  # the interface the inventory gave Gloo is where members start from
    argv = argv_of(netcheck.check_command(worker, IMAGE))
    assert argv[argv.index("--ifname") + 1] == "eth9" and "GLOO_SOCKET_IFNAME=eth9" in argv
    _, worker = pool(gloo_socket_ifname="eth0,eth1")
    assert "--ifname" not in argv_of(netcheck.check_command(worker, IMAGE))
    one = resolve([("a", {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm",
                          "pool": "p"})]).hosts["a"].services[0]
    command = netcheck.check_command(one, IMAGE)
    for absent in ("--reach-timeout", "NCCL_DEBUG", "--cap-add", "--hca-loopback", "--device /dev/infiniband"):
        assert absent not in command


def report_with(log: list[str], busbw: float = 400.0, loopback: dict | None = None) -> dict:
    """A host's output as the check prints it: NCCL's lines, its JSON, the loopback's JSON line."""
    import json

    results = [{"op": "all_reduce", "bytes": 1 << 34, "time_us": 1.0, "algbw_gbs": busbw / 2, "busbw_gbs": busbw}]
    stdout = [*log, json.dumps({"ok": True, "backend": "nccl", "results": results, "reach_s": 0.4,
                                "interface": {"NCCL_SOCKET_IFNAME": "=enP6p3s0f0np0"}})]
    if loopback is not None:
        stdout.append(json.dumps({"hca_loopback": loopback}))
    return netcheck.host_report(True, stdout, [])


def test_sockets_on_hosts_with_active_hcas_refuse_the_pool_naming_the_host():
    log = nccl_lines("socket-on-dgx-a100-with-hcas.txt")
    reports = {"gpu01": report_with(log), "gpu02": report_with(nccl_lines("roce-2node-dgxh100.txt"))}
    fabrics = {"gpu01": fabric("gpu01", hcas=("mlx5_10", "mlx5_11")),
               "gpu02": fabric("gpu02", hcas=("mlx5_10", "mlx5_11"))}
    verdict = netcheck.judge("p", ["gpu01", "gpu02"], reports, None, fabrics=fabrics)
    assert not verdict["ok"]
    assert verdict["problems"] == [
        "gpu01: NCCL used sockets (enp225s0f1) although its HCAs mlx5_10,mlx5_11 (interface enP6p3s0f0np0) are "
        "active: the container lacks /dev/infiniband, IPC_LOCK or an unlimited memlock, or NCCL_IB_HCA matches "
        "none of them"]
    assert verdict["per_host"]["gpu02"]["transport"]["kind"] == "IB"
    assert verdict["per_host"]["gpu02"]["reach_s"] == 0.4
    assert verdict["per_host"]["gpu02"]["container_env"] == {"NCCL_SOCKET_IFNAME": "=enP6p3s0f0np0"}


def test_roce_on_the_derived_hcas_passes_and_other_hcas_fail():
    log = nccl_lines("roce-2node-dgxh100.txt")
    right = {h: fabric(h, hcas=("mlx5_10", "mlx5_11")) for h in ("a", "b")}
    reports = {"a": report_with(log), "b": report_with(log)}
    assert netcheck.judge("p", ["a", "b"], reports, None, fabrics=right)["ok"]
    wrong = {**right, "b": fabric("b", hcas=("mlx5_0", "mlx5_1"))}
    assert netcheck.judge("p", ["a", "b"], reports, None, fabrics=wrong)["problems"] == [
        "b: NCCL used HCAs mlx5_10,mlx5_11, not the derived mlx5_0,mlx5_1"]


def test_no_nccl_log_is_no_proof_and_sockets_off_the_derived_interface_fail():
    quiet = netcheck.host_report(True, ['{"ok": true, "backend": "nccl", "results": []}'], [])
    verdict = netcheck.judge("p", ["a"], {"a": quiet}, None, fabrics={"a": fabric("a")})
    assert len(verdict["problems"]) == 1 and "NCCL printed no INFO line" in verdict["problems"][0]
    sockets = report_with(nccl_lines("socket-loopback-ib-disabled.txt"))
    verdict = netcheck.judge("p", ["a"], {"a": sockets}, None, fabrics={"a": fabric("a", rdma=False)})
    assert verdict["problems"] == ["a: NCCL's sockets went over lo, not the derived interface enP6p3s0f0np0"]
    on_lo = {"a": fabric("a", rdma=False, ifname="lo")}
    assert netcheck.judge("p", ["a"], {"a": sockets}, None, fabrics=on_lo)["ok"]


def test_an_nvlink_domain_member_outside_the_pools_mnnvl_fabric_fails():
    tray = report_with(nccl_lines("mnnvl-gb200-tray.txt"))
    alone = report_with(nccl_lines("ib-sharp-plugin-no-prefix.txt"))  # MNNVL fabric UUID 0.0: no domain
    fabrics = {h: fabric(h, rdma=False, imex=True) for h in ("t1", "t2", "t3")}
    verdict = netcheck.judge("p", ["t1", "t2", "t3"], {"t1": tray, "t2": tray, "t3": alone}, None,
                             fabrics=fabrics)
    assert [p for p in verdict["problems"] if "MNNVL" in p] == [
        "t3: its GPUs report no MNNVL fabric (the NVLink domain is not formed: Fabric Manager, IMEX or the "
        "switch trays)"]


def test_hca_loopback_figures_against_the_catalog_and_the_pool_median():
    log = nccl_lines("roce-2node-dgxh100.txt")
    two = ("mlx5_10", "mlx5_11")
    figures = {"a": 44.0, "b": 43.5, "c": 28.0, "d": 45.0}
    reports = {h: report_with(log, loopback={"ok": True, "bytes": 1 << 34, "busbw_gbs": bw, "net_lines": log[5:6]})
               for h, bw in figures.items()}
    fabrics = {h: fabric(h, hcas=two) for h in figures}
    verdict = netcheck.judge("p", list(figures), reports, None, fabrics=fabrics)
    assert verdict["problems"] == ["c: HCA loopback all_reduce busbw 28.0 GB/s < 0.7 x the pool's median 43.75 GB/s "
                                   "(HCAs mlx5_10,mlx5_11 (interface enP6p3s0f0np0))"]
    assert verdict["per_host"]["a"]["hca_loopback"]["transport"]["ib"][0]["hca"] == "mlx5_10"
    verdict = netcheck.judge("p", list(figures), reports, None, fabrics=fabrics, loopback_minimum=44.0)
    assert [p.split(":")[0] for p in verdict["problems"]] == ["b", "c"]
    broken = {**reports, "d": report_with(log, loopback={"ok": False, "error": "HCA loopback: rank 3: NCCL error"})}
    assert "d: HCA loopback: rank 3: NCCL error (HCAs mlx5_10,mlx5_11" in " ".join(
        netcheck.judge("p", list(figures), broken, None, fabrics=fabrics)["problems"])


def test_thresholds_come_from_the_fabric_catalog_only_for_the_hcas_they_were_measured_with():
    _, worker = pool()
    h100 = replace(worker, hardware=load_catalog().hardware["h100"])
    assert netcheck.threshold(replace(h100, fabric=fabric("t2", hcas=HCAS))) == 375.0
    assert netcheck.loopback_threshold(replace(h100, fabric=fabric("t2", hcas=HCAS))) == 40.0
    assert netcheck.threshold(replace(h100, fabric=fabric("t2", hcas=HCAS[:4]))) is None
    assert netcheck.threshold(worker) is None  # gb300: no sourced figure (docs/multi-node.md says what was looked at)
    assert netcheck.threshold(replace(h100, netcheck_min_busbw_gbps=300.0)) == 300.0
    catalog = netcheck.fabric_catalog()
    assert catalog["median_floor"] == 0.7
    for board in catalog["boards"].values():
        assert "issues/309" in board["multinode_source"] and "nd96isr_h100_v5" in board["hca_loopback_source"]


def test_the_h100_multinode_figure_is_four_fifths_of_the_published_16_gib_busbw():
    rows = [line.split() for line in public_sample_lines("h100x16-all_reduce_perf-2node.txt")]
    published = float(next(row for row in rows if row[:1] == ["17179869184"])[7])  # out-of-place busbw
    assert published == 469.21
    board = netcheck.fabric_catalog()["boards"]["h100"]
    assert board["multinode_allreduce_busbw_gbps"] == pytest.approx(0.8 * published, abs=1.0)
    assert board["multinode_hcas"] == 8 and "469.21" in board["multinode_source"]


def test_boards_without_a_sourced_figure_are_judged_on_correctness_transport_and_the_median_alone():
    hardware = load_catalog().hardware
    boards = netcheck.fabric_catalog()["boards"]
    assert set(boards) <= set(hardware)
    _, worker = pool()
    for board in ("h200", "b200", "b300", "gb300"):
        assert board not in boards
        for hcas in (HCAS[:4], HCAS):
            member = replace(worker, hardware=hardware[board], fabric=fabric("t2", hcas=hcas))
            assert netcheck.threshold(member) is None and netcheck.loopback_threshold(member) is None


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


# The IMEX stage through pyinfra's @fake connector, with the pool's fabric the run context would derive.


def fake_harness():
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fake"))
    import harness

    return harness


def trays(monkeypatch, errors=(), channels=()):
    """Two GB300 trays of one pool; the run context gives their fabric, and their probes' IMEX channels."""
    from modelfleet.context import HostRun
    from modelfleet.fabric import PoolFabric

    names = ("@fake/t1", "@fake/t2")
    nodes = ("192.168.40.1", "192.168.40.2")
    fabrics = {n: fabric(n, imex=True, imex_nodes=nodes) for n in names}
    monkeypatch.setattr(HostRun, "fabric", lambda self, pool: PoolFabric(pool, hosts=fabrics, errors=list(errors)),
                        raising=False)
    monkeypatch.setattr(HostRun, "probe_on", lambda self, name: {"fabric": {"imex": {"channels": list(channels)}}},
                        raising=False)
    data = {"hardware": "gb300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": "e" * 40, "pool": "k31"}
    return [(n.split("/")[1], {**data, "ssh_hostname": f"10.0.0.{i + 1}"}) for i, n in enumerate(names)]


def test_imex_on_fresh_trays_writes_the_node_list_makes_the_channel_and_starts_the_service(monkeypatch):
    from modelfleet.pipeline import run_stages
    from modelfleet.stages import imex

    harness = fake_harness()
    uploads = harness.Uploads(monkeypatch)
    hosts = trays(monkeypatch)
    state = harness.run_fake(hosts, lambda: run_stages(imex))
    commands = harness.executed(state, "t2")
    assert uploads.files[imex.NODES_CONFIG] == "192.168.40.1\n192.168.40.2\n"
    assert "options nvidia NVreg_CreateImexChannel0=1" in uploads.files[imex.MODPROBE_CONF]
    assert any("mknod -m 666 /dev/nvidia-caps-imex-channels/channel0" in c for c in commands)
    assert commands[-2:] == ["systemctl enable nvidia-imex.service", "systemctl start nvidia-imex.service"]


def test_converged_imex_trays_get_no_commands(monkeypatch):
    import hashlib

    from modelfleet.pipeline import run_stages
    from modelfleet.stages import imex

    harness = fake_harness()

    def file_line(content):
        return f"file 644 root root {hashlib.sha256(content.encode()).hexdigest()}"

    replies = {"@@modelfleet-state": [
        f"@@modelfleet-state path {imex.IMEX_DIR}", "dir 755 root root -",
        f"@@modelfleet-state path {imex.NODES_CONFIG}", file_line("192.168.40.1\n192.168.40.2\n"),
        f"@@modelfleet-state path {imex.MODPROBE_CONF}", file_line(imex.modprobe_conf()),
        f"@@modelfleet-state unit {imex.UNIT}", "ActiveState=active", "UnitFileState=enabled"]}
    hosts = [(n, {**d, "fake_responses": replies}) for n, d in trays(monkeypatch, channels=["channel0"])]
    state = harness.run_fake(hosts, lambda: run_stages(imex))
    host = state.inventory.get_host("@fake/t1")
    assert [state.get_op_meta(h).names for h in state.get_op_order()
            if state.get_op_data_for_host(host, h).operation_meta.did_change()] == []
    assert len(harness.executed(state, "t1")) == 1  # what is deployed (the channel came with the probe)


def test_a_pool_whose_fabric_has_errors_is_refused_before_the_gate_runs(monkeypatch, tmp_path, caplog):
    from pyinfra.api.exceptions import PyinfraError

    from modelfleet.pipeline import run_stages
    from modelfleet.stages import netcheck as netcheck_stage

    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    harness = fake_harness()
    errors = [("host t2", "NCCL_IB_HCA", "mlx5_4 has no RoCE v2 GID on the rail"),
              ("pool k31", "hcas", "t1 has 4 active HCAs, t2 has 3")]
    hosts = trays(monkeypatch, errors)
    with pytest.raises(PyinfraError):
        harness.run_fake(hosts, lambda: run_stages(netcheck_stage))
    refused = [r.getMessage() for r in caplog.records if "refused:" in r.getMessage()]
    for line in ("refused: pool k31: host t2: NCCL_IB_HCA: mlx5_4 has no RoCE v2 GID on the rail",
                 "refused: pool k31: pool k31: hcas: t1 has 4 active HCAs, t2 has 3"):
        assert any(line in message for message in refused), refused
    import json

    report = json.loads((tmp_path / "netcheck" / "k31.json").read_text())
    assert report["ok"] is False and report["hosts"] == ["@fake/t1", "@fake/t2"] and report["stage"] == "fabric"
    assert report["problems"] == ["pool k31: host t2: NCCL_IB_HCA: mlx5_4 has no RoCE v2 GID on the rail",
                                  "pool k31: pool k31: hcas: t1 has 4 active HCAs, t2 has 3"]
    state = harness.run_fake(hosts, lambda: run_stages(netcheck_stage), dry=True)
    assert not any("docker run" in c for c in harness.planned(state, "t1"))
    assert "<refuse>" in harness.planned(state, "t1")


def test_the_hca_loopback_runs_this_host_alone_with_shm_p2p_and_nvls_off(monkeypatch, tmp_path):
    """The child run's command line and environment, and what comes back from its output (a stand-in for
    python3 prints what the check prints: NCCL's lines and the JSON report)."""
    child = tmp_path / "child.sh"
    child.write_text("#!/bin/sh\n"
                     f'echo "$@" > {tmp_path}/argv\n'
                     f'env | grep -E "^NCCL_(SHM|P2P|NVLS|MNNVL)" | sort > {tmp_path}/env\n'
                     "echo 'h:1:2 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.0.0.1<0>'\n"
                     "echo 'h:1:2 [0] NCCL INFO Using network IB'\n"
                     'echo \'{"ok": true, "results": [{"op": "all_reduce", "bytes": 17179869184, "busbw_gbs": 41.2}]}\'\n')
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
