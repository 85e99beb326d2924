"""Stock pyinfra doing what a no-op converge does, for `make bench-converge`'s control-node CPU comparison:
MODELFLEET_BENCH_OPS operations per host, each a files.directory or files.file whose target the first run made,
so every later run is all no-ops with one fact (one remote command) each, as stock pyinfra runs them."""

import os

from pyinfra.operations import files

ROOT = "/tmp/modelfleet-bench-stock"

files.directory(name=f"Directory {ROOT}", path=ROOT)
for i in range(1, int(os.environ["MODELFLEET_BENCH_OPS"])):
    if i % 2:
        files.directory(name=f"Directory {i}", path=f"{ROOT}/d{i}")
    else:
        files.file(name=f"File {i}", path=f"{ROOT}/f{i}")
