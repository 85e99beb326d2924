"""`python -m modelfleet.cli`: the same command line as the `modelfleet` entry point."""

from modelfleet.cli import main

main()
