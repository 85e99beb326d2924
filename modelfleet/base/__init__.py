"""The base floor: what every floor uses: the grammar, errors, keys and their masking, the loader, host commands.
An import from here points only at lower floors (tests/unit/test_layers.py)."""
