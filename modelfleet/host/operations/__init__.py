"""Custom idempotent operations where pyinfra has none."""
