"""pyinfra facts: each parses real command output (see tests/fixtures and tests/facts)."""
