"""`python -m modelfleet.cli`: the same command line as the `modelfleet` entry point."""

from modelfleet.cli import main

if __name__ == "__main__":  # importing the module (a walk of the package) runs nothing
    main()
