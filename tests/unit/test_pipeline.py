"""The pipeline a newcomer reads in deploys/serve.py is the one modelfleet.deploys.serve runs, and no stage
imports another stage (shared decisions live in pins, units and gpu_predicates)."""

import ast
from pathlib import Path

from modelfleet import pipeline

ROOT = Path(__file__).resolve().parents[2]


def called_stages(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "run_stages")
    return [arg.id for arg in call.args]


def test_deploys_serve_names_the_pipeline_in_order():
    assert called_stages(ROOT / "deploys" / "serve.py") == [s.__name__.rsplit(".", 1)[-1] for s in pipeline.SERVE]


def test_no_stage_imports_another_stage():
    for path in (ROOT / "modelfleet" / "stages").glob("*.py"):
        if path.name == "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("modelfleet.stages."):
                raise AssertionError(f"{path.name} imports {node.module}")
            if isinstance(node, ast.ImportFrom) and node.module == "modelfleet.stages":
                names = {alias.name for alias in node.names}
                stage_modules = {p.stem for p in path.parent.glob("*.py")} - {"__init__"}
                assert not names & stage_modules, f"{path.name} imports stage(s) {names & stage_modules}"
