"""The one base of modelfleet's own exceptions: `except ModelfleetError` catches every refusal modelfleet raises
with a message meant for the operator (a catalog or inventory that cannot be used, a price file, a model source,
an SSH host key), and lets a bug's exception through. Each also derives from the builtin or library exception of
its kind (a PriceError is a ValueError, a HostKeyError paramiko's SSHException), which handlers of those catch."""

from __future__ import annotations


class ModelfleetError(Exception):
    """Base of modelfleet's exceptions."""
