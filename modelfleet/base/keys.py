"""Keys from the control node's environment: a service's `api_key_env`, a front door's client keys, the hub token.
The inventory names variables, never values; this is the one place their values are read, so what "set" and
"empty" mean (and that a value is never held anywhere else) is decided once."""

from __future__ import annotations

import os


def from_env(name: str | None) -> str | None:
    """The value of the control node's variable NAME as set (not stripped); None when NAME is unset or no name."""
    return os.environ.get(name) if name else None


def required(name: str) -> str:
    """The value of NAME without surrounding whitespace, for a key validation has seen set (KeyError if not)."""
    value = from_env(name)
    if value is None:
        raise KeyError(name)
    return value.strip()


def stripped(name: str | None) -> str:
    """The value of NAME without surrounding whitespace; "" when it is unset, empty or no name."""
    return (from_env(name) or "").strip()
