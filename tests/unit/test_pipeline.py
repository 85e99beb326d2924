"""The pipeline a newcomer reads in deploys/serve.py is the one modelfleet.deploys.serve runs; every stage keeps
the Stage contract; no stage imports another stage (shared decisions live in pins, units and gpu_predicates),
and a stage's parts (gpu_stack's os_base, gpu_driver, container_runtime) are imported by it alone."""

import ast
from pathlib import Path

from modelfleet import pipeline
from modelfleet.stages import Stage, gpu_stack

ROOT = Path(__file__).resolve().parents[2]


def called_stages(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "run_stages")
    return [arg.id for arg in call.args]


def test_deploys_serve_names_the_pipeline_in_order():
    assert called_stages(ROOT / "deploys" / "serve.py") == [s.__name__.rsplit(".", 1)[-1] for s in pipeline.SERVE]


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
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("modelfleet.stages."):
                assert node.module.rsplit(".", 1)[-1] in mine, f"{path.name} imports {node.module}"
            if isinstance(node, ast.ImportFrom) and node.module == "modelfleet.stages":
                names = {alias.name for alias in node.names} & stage_modules
                assert names <= mine, f"{path.name} imports stage(s) {names - mine}"
    for path in (ROOT / "modelfleet").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "modelfleet.stages":
                used = {alias.name for alias in node.names} & set(parts)
                assert not used or path.name in ("gpu_stack.py", "mirror.py"), f"{path} uses gpu_stack's parts {used}"
