"""What a @fake run of the GPU stack would send to a host, per operation: its commands (FunctionCommands by name,
arguments and the shell their bodies run; uploads with their content) and what DeployedState asked. For tests
that compare what an OS family makes the stages send (tests/stages/test_os_*)."""

from __future__ import annotations

import shlex

from pyinfra.connectors.fake import FakeConnector


def harness():
    from tests.conftest import _fake_harness

    return _fake_harness()


# Operations whose commands are no OS family's (GPU checks, the reboot, the report): named, their commands not kept.
NOT_THE_FAMILYS = ("A container sees", "GPUs answer", "Reboot for", "GPU stack report")


def _command(command) -> object:
    """A command as the host gets it: FunctionCommands by name and arguments, uploads with their content; the
    key check's program (modelfleet/files, not the family's) by name."""
    from modelfleet.plan import trust

    function = getattr(command, "function", None)
    if function:
        return [f"<{function.__name__}>", [repr(a) for a in command.args], _asks(command)]
    if hasattr(command, "dest"):
        return [f"<upload {command.dest}>", command.src.getvalue().decode()]
    return command.get_masked_value().replace(shlex.quote(trust.CHECK_PROGRAM.read_text()), "<key check>")


class _Asked:
    """A host for a FunctionCommand's body: records what it runs, answers every command with `answer`."""

    def __init__(self, answer: bool):
        self.ran: list[str] = []
        self.answer = answer

    def run_shell_command(self, command, **kwargs):
        self.ran.append(command.get_raw_value())
        return self.answer, None


def _asks(command) -> list[str]:
    """The shell commands a FunctionCommand's body runs on the host: each answered no (nothing interrupted),
    or, for a body that would then refuse the host, yes (the archive has the package)."""
    for answer in (False, True):
        host = _Asked(answer)
        try:
            command.function(None, host, *command.args, **command.kwargs)
            return host.ran
        except AttributeError:  # it reached refuse() or note(), which need a real state
            continue
    return ["<not run>"]


def _steps(state, name: str) -> list:
    """Each operation's name and the commands a run would send for it."""
    from pyinfra.context import ctx_host, ctx_state

    host = state.inventory.get_host(f"@fake/{name}")
    out = []
    with ctx_state.use(state), ctx_host.use(host):
        for op_hash in state.get_op_order():
            op_name = ", ".join(state.get_op_meta(op_hash).names)
            commands = state.get_op_data_for_host(host, op_hash).command_generator()
            theirs = any(name in op_name for name in NOT_THE_FAMILYS)
            out.append([op_name, [] if theirs else [_command(c) for c in commands]])
    return out


def _state_query(command: str) -> dict:
    """DeployedState's command: what it asks (KIND=VALUE) and the shell functions it is given (the family's
    package query among them); the program's own text is the fact's, not the family's."""
    words = shlex.split(command)
    program, args = words[2], words[4:]
    functions = [line for line in program.splitlines() if line.split("(", 1)[0].isidentifier()
                 and line.split("(", 1)[1:2] and line.split("(", 1)[1].startswith(") {")]
    return {"asks": args, "functions": functions}


def run(fake, hosts: dict, dry: bool = True) -> tuple[list, list]:
    asked: list[str] = []
    original = FakeConnector.run_shell_command

    def record(self, command, *args, **kwargs):
        text = command.get_raw_value() if hasattr(command, "get_raw_value") else str(command)
        if "deployed_state" in text:
            asked.append(text)
        return original(self, command, *args, **kwargs)

    FakeConnector.run_shell_command = record
    try:
        from tests.stages.test_gpu_driver import stack_only

        state = fake.run_fake([("n1", hosts)], stack_only, dry=dry)
    finally:
        FakeConnector.run_shell_command = original
    return _steps(state, "n1"), [_state_query(c) for c in asked]


