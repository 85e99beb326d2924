"""The one base of modelfleet's own exceptions: `except ModelfleetError` catches every refusal modelfleet raises
with a message meant for the operator (a catalog or inventory that cannot be used, a price file, a model source,
an SSH host key), and lets a bug's exception through. Each keeps the builtin or library base it had (a PriceError
is still a ValueError, a HostKeyError still paramiko's SSHException), so existing handlers catch it as before."""

from __future__ import annotations


class ModelfleetError(Exception):
    """Base of modelfleet's exceptions."""
