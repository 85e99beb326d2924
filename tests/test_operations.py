"""pyinfra-testing operation cases, a changed and an unchanged case per custom operation:
tests/operations/<module path under modelfleet>.<operation>/<case>.yaml (kwargs, the commands it yields,
or the no-op it reports). Every operation decides from the host state it is given, so the cases need no facts."""

from pathlib import Path

from pyinfra_testing.operations import make_operation_tests

BASE = Path(__file__).parent / "operations"

for _operation in sorted(d.name for d in BASE.iterdir() if d.is_dir()):
    locals()[_operation] = make_operation_tests("modelfleet", _operation, BASE / _operation)
