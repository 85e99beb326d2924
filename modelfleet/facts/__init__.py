"""pyinfra facts: each parses real command output (see shared/fixtures and tests/facts)."""
