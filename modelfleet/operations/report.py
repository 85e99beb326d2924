"""Stop a host with its reasons: the operation fails at execution, so later stages never run there."""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api import FunctionCommand, operation


def refuse(state, host, reasons: list[str]) -> bool:
    """FunctionCommand body: log each reason against the host and fail. (pyinfra passes `state` and `host`,
    and uses the return value as the status, only when the function names both.)"""
    for reason in reasons:
        host.log_styled(f"refused: {reason}", fg="red", log_func=logger.error)
    return False


@operation(is_idempotent=False)
def fail_host(reasons: list[str]):
    yield FunctionCommand(refuse, (reasons,), {})
