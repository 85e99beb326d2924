"""The host floor: what a host has and how it changes: facts, OS families, operations, units, fabric, SSH.
An import from here points only at lower floors (tests/unit/test_layers.py)."""
