"""The plan floor: what should be, from the inventory and the catalog: plans, capacity, rendered files;
nothing connects.
An import from here points only at lower floors (tests/unit/test_layers.py)."""
