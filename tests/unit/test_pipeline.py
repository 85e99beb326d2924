"""The pipeline deploys/serve.py runs is the one modelfleet.run.deploys.serve runs (each deploy file calls its function
and nothing else, so a stage list has one home); every stage keeps
the Stage contract; no stage imports another stage (shared decisions live in pins, units and gpu_predicates),
and a stage's parts (gpu_stack's os_base, gpu_driver, container_runtime) are imported by it alone."""

import ast
from pathlib import Path

from modelfleet.run import deploys, pipeline
from modelfleet.run.stages import Stage, gpu_stack

ROOT = Path(__file__).resolve().parents[2]


def statements(path: Path) -> list[str]:
    """A deploy file's statements but its docstring."""
    body = ast.parse(path.read_text()).body
    return [ast.unparse(node) for node in body
            if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]


def test_each_deploy_file_runs_its_function_of_the_package_and_nothing_else():
    files = sorted((ROOT / "deploys").glob("*.py"))
    assert "serve" in {p.stem for p in files}
    for path in files:
        name = path.stem
        assert statements(path) == [f"from modelfleet.run.deploys import {name}", f"{name}()"], path.name
        assert callable(getattr(deploys, name))


def test_serve_runs_the_pipeline_in_order(monkeypatch):
    ran = []
    monkeypatch.setattr(deploys, "run_stages", lambda *stages: ran.append(stages))
    deploys.serve()
    assert ran == [pipeline.SERVE]


def test_every_stage_keeps_the_contract_and_its_name():
    for stage in pipeline.SERVE:
        assert isinstance(stage, Stage), stage.__name__
        assert stage.NAME == stage.__name__.rsplit(".", 1)[-1]
        assert stage.PINS <= {"images", "revisions", "listings"}


def test_no_stage_imports_another_stage():
    parts = {part.__name__.rsplit(".", 1)[-1]: "gpu_stack.py" for part in gpu_stack.PARTS}
    stage_modules = {p.stem for p in (ROOT / "modelfleet" / "stages").glob("*.py")} - {"__init__"}
    for path in (ROOT / "modelfleet" / "stages").glob("*.py"):
        if path.name == "__init__.py":
            continue
        mine = {name for name, owner in parts.items() if owner == path.name}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("modelfleet.run.stages."):
                assert node.module.rsplit(".", 1)[-1] in mine, f"{path.name} imports {node.module}"
            if isinstance(node, ast.ImportFrom) and node.module == "modelfleet.run.stages":
                names = {alias.name for alias in node.names} & stage_modules
                assert names <= mine, f"{path.name} imports stage(s) {names - mine}"
    for path in (ROOT / "modelfleet").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "modelfleet.run.stages":
                used = {alias.name for alias in node.names} & set(parts)
                assert not used or path.name in ("gpu_stack.py", "urls.py"), f"{path} uses gpu_stack's parts {used}"
