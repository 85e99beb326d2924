"""The gate of a pool across hosts (stages/netcheck.py, files/nccl_check.py): its container carries the pool's
fabric like the engine's, members reach the head in seconds or the pair is named, NCCL's own log decides which
transport ran (verbatim public logs, tests/fixtures/nccl), and HCA loopback figures are held to the catalog and
to the pool's median."""

import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from modelfleet.plan import render
from modelfleet.plan.catalog import load_catalog
from modelfleet.plan.inventory import resolve
from modelfleet.run.stages import netcheck
from tests.helpers.fabric_doubles import HCAS, fabric, trays
from tests.helpers.public_samples import public_sample_lines

NCCL = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"
IMAGE = "vllm/vllm-openai@sha256:" + "0" * 64


def nccl_lines(name: str) -> list[str]:
    return (NCCL / name).read_text().split("# ---\n", 1)[1].splitlines()


def pool(hosts=("t1", "t2"), **extra):
    data = {"hardware": "gb300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": "e" * 40, "pool": "k31",
            **extra}
    resolved = resolve([(h, {**data, "ssh_hostname": f"10.0.0.{i + 1}"}) for i, h in enumerate(hosts)])
    assert not resolved.errors, resolved.errors
    return [resolved.hosts[h].services[0] for h in hosts]


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


def test_the_h200_recording_passes_on_its_socket_fabric_and_would_fail_a_member_with_hcas():
    # The real gate output of the 1x H200 VM (NCCL 2.28.9, sockets on eth0): right for a member without HCAs,
    # refused had the same log come from a member whose HCAs are active.
    report = report_with(nccl_lines("h200x1-socket-eth0-nccl-2.28.9.txt"))
    sockets = fabric("h200", rdma=False, hcas=(), ifname="eth0")
    assert netcheck.judge("p", ["h200"], {"h200": report}, None, fabrics={"h200": sockets})["ok"]
    with_hcas = fabric("h200", hcas=("mlx5_0", "mlx5_1"), ifname="eth0")
    assert netcheck.judge("p", ["h200"], {"h200": report}, None, fabrics={"h200": with_hcas})["problems"] == [
        "h200: NCCL used sockets (eth0) although its HCAs mlx5_0,mlx5_1 (interface eth0) are active: the "
        "container lacks /dev/infiniband, IPC_LOCK or an unlimited memlock, or NCCL_IB_HCA matches none of them"]


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


# The gate stage through pyinfra's @fake connector, with the pool's fabric the run context would derive.


def test_a_pool_whose_fabric_has_errors_is_refused_before_the_gate_runs(fake, monkeypatch, tmp_path, caplog):
    from pyinfra.api.exceptions import PyinfraError

    from modelfleet.run.pipeline import run_stages
    from modelfleet.run.stages import netcheck as netcheck_stage

    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    errors = [("host t2", "NCCL_IB_HCA", "mlx5_4 has no RoCE v2 GID on the rail"),
              ("pool k31", "hcas", "t1 has 4 active HCAs, t2 has 3")]
    hosts = trays(monkeypatch, errors)
    with pytest.raises(PyinfraError):
        fake.run_fake(hosts, lambda: run_stages(netcheck_stage))
    refused = [r.getMessage() for r in caplog.records if "refused:" in r.getMessage()]
    for line in ("refused: pool k31: host t2: NCCL_IB_HCA: mlx5_4 has no RoCE v2 GID on the rail",
                 "refused: pool k31: pool k31: hcas: t1 has 4 active HCAs, t2 has 3"):
        assert any(line in message for message in refused), refused
    import json

    report = json.loads((tmp_path / "netcheck" / "k31.json").read_text())
    assert report["ok"] is False and report["hosts"] == ["@fake/t1", "@fake/t2"] and report["stage"] == "fabric"
    assert report["problems"] == ["pool k31: host t2: NCCL_IB_HCA: mlx5_4 has no RoCE v2 GID on the rail",
                                  "pool k31: pool k31: hcas: t1 has 4 active HCAs, t2 has 3"]
    state = fake.run_fake(hosts, lambda: run_stages(netcheck_stage), dry=True)
    assert not any("docker run" in c for c in fake.planned(state, "t1"))
    assert "<refuse>" in fake.planned(state, "t1")
