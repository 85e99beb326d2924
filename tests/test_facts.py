"""pyinfra-testing fact cases: one file per case under tests/facts/<module>.<Fact>/."""

from pathlib import Path

from pyinfra_testing.facts import make_fact_tests

BASE = Path(__file__).parent / "facts"

for _fact in sorted(d.name for d in BASE.iterdir() if d.is_dir()):
    locals()[_fact] = make_fact_tests("modelfleet.host.facts", _fact, BASE / _fact)
