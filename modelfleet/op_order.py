"""pyinfra's operation order, read from frame objects instead of source files.

pyinfra orders each operation by the line numbers of its call stack (pyinfra.api.util.
get_operation_order_from_stack). It builds them with inspect.stack() and getframeinfo(), which look up every
frame's source file and lines: twice per frame, for every operation on every host. modelfleet's operations sit
under the pipeline and a stage's @deploy, about 23 frames deep, so this was the largest per-host cost of a
no-op converge on the control node. Frames carry the file name and line number themselves; this returns the
same list (tests/unit/test_op_order.py holds it to pyinfra's own on real stacks) without reading a file.

`pipeline.run_stages` installs it for the run, and only over pyinfra releases whose function it was held to
(CHECKED_PYINFRA); under any other release pyinfra's own function stays in place: slower, never wrong.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys

import pyinfra
from pyinfra.api import util as _util

# The module, not the `operation` decorator that pyinfra.api exports under the same name.
_operation = importlib.import_module("pyinfra.api.operation")


def operation_order_from_stack(state) -> list[int]:
    frames = []
    frame = sys._getframe(1)  # from the caller: pyinfra's own frame is never counted anyway
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    frames.reverse()  # outermost first, as pyinfra's reversed(stack())
    start = 0
    if state.current_deploy_filename:
        # pyinfra's loop, when no frame is the deploy file's, stops at its own frame, which it never counts
        matches = [i for i, frame in enumerate(frames) if frame.f_code.co_filename == state.current_deploy_filename]
        start = matches[0] if matches else len(frames)
    line_numbers = [state.current_op_file_number] if pyinfra.is_cli else []
    for frame in frames[start:]:
        if not frame.f_code.co_filename.startswith(_util.PYINFRA_INSTALL_DIR):
            line_numbers.append(frame.f_lineno)
    return line_numbers


# pyinfra releases (major.minor) whose get_operation_order_from_stack this reproduces; any other release that
# pyproject.toml's range admits runs pyinfra's own.
CHECKED_PYINFRA = ("3.10",)


def pyinfra_series() -> str:
    try:
        version = importlib.metadata.version("pyinfra")
    except importlib.metadata.PackageNotFoundError:
        return ""
    return ".".join(version.split(".")[:2])


def install() -> bool:
    """Use it for the operations of this process, where pyinfra's own function is the one in place and this
    pyinfra release is one it was checked against; True when it is in use."""
    current = getattr(_operation, "get_operation_order_from_stack", None)
    if current is operation_order_from_stack:
        return True
    if current is not _util.get_operation_order_from_stack or pyinfra_series() not in CHECKED_PYINFRA:
        return False
    _operation.get_operation_order_from_stack = operation_order_from_stack
    return True
