"""Keys and tokens for tests, made when the test runs: no key-shaped value is committed to the repository."""

import secrets


def made_key(label: str = "test") -> str:
    """A fresh random value for a key a test sets in the control node's environment."""
    return f"{label}-{secrets.token_hex(12)}"
