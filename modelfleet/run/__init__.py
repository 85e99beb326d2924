"""The run floor: one deploy run: its context, pins, pipeline, stages, checks, the retire plan, the timeline.
An import from here points only at lower floors (tests/unit/test_layers.py)."""
