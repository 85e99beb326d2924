"""The NCCL INFO log parser (modelfleet.base.nccl_log) on verbatim public logs and this project's own H200 recording
(tests/fixtures/nccl, see SOURCE)."""

from pathlib import Path

from modelfleet.base import nccl_log

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "tests" / "fixtures" / "nccl"


def log(name: str) -> list[str]:
    return (FOLDER / name).read_text().split("# ---\n", 1)[1].splitlines()


def test_every_fixture_names_its_source():
    listed = (FOLDER / "SOURCE").read_text()
    for path in FOLDER.glob("*.txt"):
        header = path.read_text().split("# ---\n")[0]
        recorded = header.split("# source: recorded by this project, ", 1)[-1].split()[0]
        assert path.name in listed
        assert "# source: https://github.com/" in header or (ROOT / recorded).is_file(), path.name


def test_roce_over_ib_verbs_on_two_dgx_h100():
    t = nccl_log.parse(log("roce-2node-dgxh100.txt"))
    assert t["network"] == "IB" and t["kind"] == "IB" and not nccl_log.over_sockets(t)
    assert t["ib"] == [{"hca": "mlx5_10", "port": 1, "link": "RoCE", "extra": None},
                       {"hca": "mlx5_11", "port": 1, "link": "RoCE", "extra": None}]
    assert t["oob"] == "enp220s0np0:11.1.128.136<0>" and t["version"] == "2.19.3+cuda12.3"


def test_infiniband_hcas_in_nccls_order_and_a_line_cut_short_changes_nothing():
    t = nccl_log.parse(log("ib-hca-order-nvswitch.txt"))
    assert nccl_log.hcas_used(t) == ["mlx5_0", "mlx5_2"]  # NCCL_IB_HCA said mlx5_2:1,mlx5_0:1
    assert {d["link"] for d in t["ib"]} == {"IB"} and t["oob"] == "ibs85f0:192.168.1.10<0>"


def test_a_socket_fallback_on_a_host_with_hcas_is_seen():
    t = nccl_log.parse(log("socket-on-dgx-a100-with-hcas.txt"))
    assert t["kind"] == "Socket" and nccl_log.over_sockets(t) and t["ib"] == []
    assert t["sockets"] == [{"ifname": "enp225s0f1", "address": "10.10.10.2"}]
    assert t["version"] == "2.11.4+cuda11.4"


def test_the_h200_vm_without_hcas_uses_sockets_on_its_derived_interface():
    # Recorded: NCCL loads its IB plugin, finds no device ("NET/IB : Using [RO]" with nothing in it) and falls
    # back to sockets on eth0, the interface NCCL_SOCKET_IFNAME==eth0 named.
    t = nccl_log.parse(log("h200x1-socket-eth0-nccl-2.28.9.txt"))
    assert t["network"] == "Socket" and t["kind"] == "Socket" and nccl_log.over_sockets(t)
    assert t["ib"] == [] and t["ib_none"] and nccl_log.hcas_used(t) == []
    assert t["sockets"] == [{"ifname": "eth0", "address": "192.0.2.2"}] and t["version"] == "2.28.9+cuda13.0"


def test_sockets_on_loopback_with_ib_disabled():
    t = nccl_log.parse(log("socket-loopback-ib-disabled.txt"))
    assert t["kind"] == "Socket" and t["sockets"] == [{"ifname": "lo", "address": "127.0.0.1"}]


def test_two_socket_interfaces_and_the_rings_transport():
    t = nccl_log.parse(log("socket-two-interfaces-rings.txt"))
    assert t["network"] is None  # NCCL 2.5 printed no "Using network" line: the rings say it
    assert [s["ifname"] for s in t["sockets"]] == ["enP1p1s0f0", "enP1p1s0f1"]
    assert t["via"] == ["NET/Socket/0"] and nccl_log.over_sockets(t)


def test_stripped_prefixes_the_ibext_plugin_mnnvl_and_nvls():
    t = nccl_log.parse(log("ib-sharp-plugin-no-prefix.txt"))
    assert t["network"] == "IBext_v8" and t["kind"] == "IB"
    assert nccl_log.hcas_used(t) == [f"ibp{i}" for i in range(8)] and t["ib"][0]["extra"] == "SHARP"
    assert t["mnnvl"] == [{"bus": "0x1a000", "uuid": "0.0", "clique": "0x0", "state": 3}]
    assert t["nvls"] == {0: True} and t["nnodes"] == 1 and t["version"] == "2.24.3+cuda12.2"


def test_a_gb200_trays_gpus_share_one_fabric_uuid_and_clique():
    t = nccl_log.parse(log("mnnvl-gb200-tray.txt"))
    assert len(t["mnnvl"]) == 4
    assert {(m["uuid"], m["clique"], m["state"]) for m in t["mnnvl"]} == {
        ("3143b15bc2cd192b.28cc9b5473fb5b93", "0x7ffe", 3)}
    assert t["kind"] is None and t["ib"] == [] and t["sockets"] == []


def test_nvls_unavailable_between_timestamp_lines():
    t = nccl_log.parse(log("nvls-unavailable-timestamped.txt"))
    assert t["nvls"] == {5: False, 6: False, 7: False}
