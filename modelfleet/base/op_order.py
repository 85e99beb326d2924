"""pyinfra's operation order, read from frame objects instead of source files.

pyinfra orders each operation by the line numbers of its call stack (pyinfra.api.util.
get_operation_order_from_stack). It builds them with inspect.stack() and getframeinfo(), which look up every
frame's source file and lines: twice per frame, for every operation on every host. modelfleet's operations sit
under the pipeline and a stage's @deploy, about 23 frames deep, so this was the largest per-host cost of a
no-op converge on the control node. Frames carry the file name and line number themselves; this returns the
same list (tests/unit/test_op_order.py holds it to pyinfra's own on real stacks) without reading a file.

The same holds for the list of pyinfra's global arguments (`_sudo`, `_env`, ...): pop_global_arguments asks
typing.get_type_hints of one class for it on every operation, fact and @deploy call, which was the largest part
of what pyinfra spent per operation once the order above was fixed. The class never changes while pyinfra runs;
`global_arguments` reads its hints once.

`pipeline.run_stages` installs both for the run, and only over pyinfra releases whose functions they were held
to (CHECKED_PYINFRA); under any other release pyinfra's own functions stay in place: slower, never wrong.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys

import pyinfra
from pyinfra.api import arguments as _arguments
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


_GLOBAL_ARGUMENTS: list[tuple[str, type]] = []
_PYINFRA_GLOBAL_ARGUMENTS = _arguments.all_global_arguments


def global_arguments() -> list[tuple[str, type]]:
    """pyinfra's all_global_arguments(), read once: (name, type) of each global argument, in its order."""
    if not _GLOBAL_ARGUMENTS:
        _GLOBAL_ARGUMENTS.extend(_PYINFRA_GLOBAL_ARGUMENTS())
    return list(_GLOBAL_ARGUMENTS)  # a copy, as pyinfra's returns a new list each call


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
    """Use both for the operations of this process, where pyinfra's own functions are the ones in place and this
    pyinfra release is one they were checked against; True when they are in use."""
    current = getattr(_operation, "get_operation_order_from_stack", None)
    arguments = getattr(_arguments, "all_global_arguments", None)
    if current is operation_order_from_stack and arguments is global_arguments:
        return True
    if (current not in (_util.get_operation_order_from_stack, operation_order_from_stack)
            or arguments not in (_PYINFRA_GLOBAL_ARGUMENTS, global_arguments)
            or pyinfra_series() not in CHECKED_PYINFRA):
        return False
    _operation.get_operation_order_from_stack = operation_order_from_stack
    # pop_global_arguments looks the name up in its module on each call (pyinfra.api.facts imported its own)
    _arguments.all_global_arguments = global_arguments
    return True
