"""Run modelfleet stages through pyinfra's @fake connector (scripted host replies, nothing executed)."""

from __future__ import annotations

from pathlib import Path

from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.deploy import add_deploy
from pyinfra.api.operations import run_ops
from pyinfra.connectors.fake import FakeConnector

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
H200 = FIXTURES / "gpu-hosts" / "h200x1-ubuntu2404"
MARK = "@@modelfleet-probe"


def recorded(path: Path) -> list[str]:
    text = path.read_text()
    if text.startswith("# ") and "\n# ---\n" in text:
        text = text.split("\n# ---\n", 1)[1]
    return [line for line in text.splitlines() if not line.startswith("__rc=")]


def probe_reply(parts: dict[str, list[str] | None]) -> list[str]:
    """The stdout HostProbe's command prints when each part printed these lines (None: the tool failed)."""
    out = []
    for name, lines in parts.items():
        out.append(f"{MARK} {name}")
        out += lines or []
        out.append(f"{MARK} rc={0 if lines is not None else 127}")
    return out


class Uploads:
    """Records what put_file would have written (the fake connector otherwise drops it)."""

    def __init__(self, monkeypatch):
        self.files: dict[str, str] = {}
        uploads = self

        def put_file(self, filename_or_io, remote_filename, remote_temp_filename=None, **kwargs):
            data = filename_or_io.read()
            # A secret goes to its temp name first, then is renamed (operations.files): kept under its final name.
            folder, _, name = remote_filename.rpartition("/")
            if name.startswith(".") and name.endswith(".modelfleet-tmp"):
                remote_filename = f"{folder}/{name[1:-len('.modelfleet-tmp')]}"
            uploads.files[remote_filename] = data.decode() if isinstance(data, bytes) else data
            return True

        monkeypatch.setattr(FakeConnector, "put_file", put_file)


def run_fake(hosts: list[tuple[str, dict]], deploy_func, dry: bool = False) -> State:
    names = [(f"@fake/{name}", {"fake_delay": 0, "fake_delay_jitter": 0, **data}) for name, data in hosts]
    inventory = Inventory((names, {}))
    state = State(inventory, Config())
    connect_all(state)
    add_deploy(state, deploy_func)
    if not dry:
        finish(state)
    return state


def finish(state: State) -> None:
    """Execute, then disconnect as pyinfra's CLI does (reports judged while planning are written then)."""
    try:
        run_ops(state)
    finally:
        disconnect_all(state)


def executed(state: State, name: str) -> list[str]:
    return state.inventory.get_host(f"@fake/{name}").connector.executed_commands


def planned(state: State, name: str) -> list[str]:
    """The commands a real run would send to the host, as `--dry` knows them (FunctionCommands by name)."""
    from pyinfra.context import ctx_host, ctx_state

    host = state.inventory.get_host(f"@fake/{name}")
    out = []
    with ctx_state.use(state), ctx_host.use(host):
        for op_hash in state.get_op_order():
            op_data = state.get_op_data_for_host(host, op_hash)
            for command in op_data.command_generator():
                function = getattr(command, "function", None)
                if function:
                    out.append(f"<{function.__name__}>")
                elif hasattr(command, "dest"):
                    out.append(f"<upload {command.dest}>")
                else:
                    out.append(command.get_masked_value())
    return out
