"""The fleet floor: the second day over many runs: status, rollout, drain, upgrade preview, mirror, URLs, shards.
An import from here points only at lower floors (tests/unit/test_layers.py)."""
