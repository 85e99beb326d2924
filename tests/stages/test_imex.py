"""The IMEX stage (stages/imex.py) through pyinfra's @fake connector, with the pool's fabric the run context
would derive: fresh trays get the node list, the channel and the service; converged trays get nothing."""

import hashlib

from modelfleet.run.pipeline import run_stages
from modelfleet.run.stages import imex
from tests.helpers.fabric_doubles import trays


def test_imex_on_fresh_trays_writes_the_node_list_makes_the_channel_and_starts_the_service(fake, uploads, monkeypatch):
    hosts = trays(monkeypatch)
    state = fake.run_fake(hosts, lambda: run_stages(imex))
    commands = fake.executed(state, "t2")
    assert uploads.files[imex.NODES_CONFIG] == "192.168.40.1\n192.168.40.2\n"
    assert "options nvidia NVreg_CreateImexChannel0=1" in uploads.files[imex.MODPROBE_CONF]
    assert any(c.endswith("imex_channel nvidia-caps-imex-channels /dev/nvidia-caps-imex-channels/channel0")
               for c in commands)
    assert commands[-2:] == ["systemctl enable nvidia-imex.service", "systemctl start nvidia-imex.service"]


def test_converged_imex_trays_get_no_commands(fake, monkeypatch):
    def file_line(content):
        return f"file 644 root root {hashlib.sha256(content.encode()).hexdigest()}"

    replies = {"@@modelfleet-state": [
        f"@@modelfleet-state path {imex.IMEX_DIR}", "dir 755 root root -",
        f"@@modelfleet-state path {imex.NODES_CONFIG}", file_line("192.168.40.1\n192.168.40.2\n"),
        f"@@modelfleet-state path {imex.MODPROBE_CONF}", file_line(imex.modprobe_conf()),
        f"@@modelfleet-state unit {imex.UNIT}", "ActiveState=active", "UnitFileState=enabled"]}
    hosts = [(n, {**d, "fake_responses": replies}) for n, d in trays(monkeypatch, channels=["channel0"])]
    state = fake.run_fake(hosts, lambda: run_stages(imex))
    host = state.inventory.get_host("@fake/t1")
    assert [state.get_op_meta(h).names for h in state.get_op_order()
            if state.get_op_data_for_host(host, h).operation_meta.did_change()] == []
    assert len(fake.executed(state, "t1")) == 1  # what is deployed (the channel came with the probe)
