"""Importing the lab does no work: it reads none of its files (build scripts, personas, recordings) until a
function asks, so every test module and command that imports it pays only for the import."""

import subprocess
import sys

from tests.conftest import ROOT

WATCH = """
import sys
opened = []
sys.addaudithook(lambda event, args: opened.append(str(args[0])) if event == "open" else None)
import lab
print("\\n".join(p for p in opened if p.startswith(sys.argv[1]) and not p.endswith((".py", ".pyc"))
                 and "__pycache__" not in p))
"""


def test_importing_the_lab_reads_none_of_its_files():
    lab_dir = str(ROOT / "lab")
    run = subprocess.run([sys.executable, "-c", WATCH, lab_dir], capture_output=True, text=True, cwd=ROOT,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == []
